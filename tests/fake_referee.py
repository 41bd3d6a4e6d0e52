"""A fake model pair for the quality referee (no model, no weights): the verifier alone always answers
right; a rule's answer is wrong with probability ``FLIP``, drawn from that answer's own seed, and each
of its answers spends the drift ``TOKEN_KL``. So the true accuracy difference is -FLIP, and the true
drift per token and per answer are known."""

import sys
import threading

import numpy as np

from cactus_theory._models._decode_spec import DecodeResult

FLIP = 0.3
TOKEN_KL = [0.25, 0.05]
RIGHT, WRONG = 1, 2
#: Decoding calls made in this process; with ``BLOCK_AFTER`` = N the call after the N-th prints BLOCKED
#: on stderr and never returns (a test kills the process there: no timing).
STATE = {"calls": 0, "block_after": None}


class FakeTokenizer:
    eos_token_id = 0
    chat_template = None

    def __call__(self, text):
        return {"input_ids": [5, 6, 7]}

    def decode(self, tokens, skip_special_tokens=True):
        return "The answer is (A)" if list(tokens) == [RIGHT] else "The answer is (B)"


class FakeModel:
    engine = "hf"
    generation_config = None


def _call():
    STATE["calls"] += 1
    if STATE["block_after"] is not None and STATE["calls"] > STATE["block_after"]:
        sys.stderr.write("BLOCKED\n")
        sys.stderr.flush()
        threading.Event().wait()


def alone(model, prompts, seeds, settings=None, max_new_tokens=128, eos_ids=()):
    _call()
    return [DecodeResult(tokens=[RIGHT]) for _ in prompts]


def speculative(
    verifier, draft, rule, m, prompts, seeds, settings=None, max_new_tokens=128, eos_ids=(), drift=False, **options
):
    _call()
    out = []
    for seed in seeds:
        wrong = np.random.default_rng(seed).random() < FLIP
        out.append(
            DecodeResult(
                tokens=[WRONG if wrong else RIGHT],
                drafted=[m],
                accepted=[m - 1],
                token_kl=list(TOKEN_KL) if drift else None,
            )
        )
    return out


class FakeDecoder:
    """A decoder (``_decoder.Decoder``'s ``generate``) giving the fake answers for its spec."""

    def __init__(self, spec):
        self.spec = spec

    def generate(self, prompts_ids, seeds, eos_ids=()):
        if self.spec.rule is None:
            return alone(None, prompts_ids, seeds)
        return speculative(None, None, self.spec.rule, self.spec.m, prompts_ids, seeds, drift=self.spec.drift)


def fake_decoder_for(spec, verifier, draft=None, *, batch=None):
    return FakeDecoder(spec)


def install(set_attribute=setattr):
    """Put the fake decoder where the referee picks its decoders (``monkeypatch.setattr`` in a test)."""
    import cactus_theory._models._decoding as decoders

    set_attribute(decoders, "decoder_for", fake_decoder_for)


def verifier():
    return (FakeModel(), FakeTokenizer(), {"name": "fake verifier"})


def choice_file(path, count, text="question"):
    """``count`` multiple-choice problems whose answer is A (``text``: the questions' stem)."""
    import json

    path.write_text(
        "".join(
            json.dumps({"question": f"{text} {i}?", "choices": ["yes", "no"], "answer": "A"}) + "\n"
            for i in range(count)
        )
    )
    return path
