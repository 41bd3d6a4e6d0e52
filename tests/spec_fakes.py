"""Fake speculative engines for the engine oracle's tests: a context-free world of small rows (each context its own
draft and verifier logits per generated position), sampled the way llama-server lays a request out (the first
token from the verifier alone, drafts from the second on, at most the tokens left less one) with standard
speculative sampling (a sampled draft), correctly or with one planted defect each:

- ``block-tokenwise``: block verification judged token by token (vllm-ascend's MagicMTP before #7807 / #7808:
  the registered ``magic-mtp`` rule's block law), while block verification (lossless) is claimed;
- ``residual-unnormalised``: the residual max(q - p, 0) inverted as it is, unnormalised (a uniform beyond its
  mass falls on the last token);
- ``residual-q``: the correction drawn from q instead of the residual;
- ``temperature-after-top-p``: the rows reported in vLLM's order (temperature, then top-p) but the tokens
  sampled with top-p on the untempered law and the temperature after;
- ``bonus-from-draft``: after m accepted drafts, the bonus token drawn from the draft's law.

``FakeEngine`` runs it in this process (an ``Engine``: fast enough for hundreds of seeded runs);
``fake_llama_server`` answers llama-server's ``/completion`` (rows as ``n_probs`` with ``post_sampling_probs``,
samples with ``timings.draft_n`` / ``draft_n_accepted``) from the same code, for ``LlamaServerEngine``.
"""

from __future__ import annotations

import numpy as np

from cactus_theory import SamplingSettings, make_rule, processed_probs
from cactus_theory._oracle._engine import Engine

DEFECTS = (
    "none",
    "block-tokenwise",
    "residual-unnormalised",
    "residual-q",
    "temperature-after-top-p",
    "bonus-from-draft",
)
#: Every context is this many tokens long: the tokens after it are the generated prefix.
CONTEXT = 3


class World:
    """Per context (its first token) and generated position: draft and verifier logits over ``vocab`` tokens,
    processed with ``settings`` (vLLM's chain) for what is reported."""

    def __init__(self, seed=0, vocab=6, positions=4, contexts=8, settings=None, spread=1.5):
        rng = np.random.default_rng(seed)
        self.vocab, self.positions = vocab, positions
        self.settings = settings or SamplingSettings(temperature=1.0, top_k=0, top_p=1.0)
        self.target = rng.normal(0, spread, (contexts, positions, vocab))
        self.target[:, 0, 0] += 4.0  # the first token nearly forced (token 0)
        self.draft = self.target + rng.normal(0, 1.0, self.target.shape)

    def context(self, c) -> list:
        return [int(c)] + [0] * (CONTEXT - 1)

    def q(self, c, i, settings=None):
        return processed_probs(self.target[c, i], settings or self.settings)

    def p(self, c, i):
        return processed_probs(self.draft[c, i], self.settings)


def _inverse(u, weights):
    """The token of ``u`` under the cumulative ``weights`` (not normalised: past their total, the last token)."""
    cdf = np.cumsum(weights)
    hit = np.flatnonzero(cdf > u)
    return int(hit[0]) if hit.size else len(weights) - 1


def speculative_sample(world, c, tokens, seed, defect="none", m=2):
    """(tokens, {"drafted", "accepted"}) of one request: ``tokens`` generated after context ``c``."""
    rng = np.random.default_rng(seed)
    wrong = None
    if defect == "temperature-after-top-p":
        s = world.settings
        wrong = SamplingSettings(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, chain="llama.cpp")

    def q_of(i):
        return world.q(c, i, wrong)

    out = [int(rng.choice(world.vocab, p=q_of(0)))]
    drafted = accepted = 0
    block = make_rule("magic-mtp") if defect == "block-tokenwise" else None
    while len(out) < tokens:
        i = len(out)
        k = min(m, tokens - i - 1)  # llama-server drafts at most the tokens left less one
        if k <= 0:
            out.append(int(rng.choice(world.vocab, p=q_of(i))))
            continue
        ps = [world.p(c, i + j) for j in range(k)]
        qs = [q_of(i + j) for j in range(k + 1)]
        drafts = [int(rng.choice(world.vocab, p=ps[j])) for j in range(k)]
        drafted += k
        if block is not None:
            law = block.block_law(np.array(ps)[None], np.array(qs)[None], np.array([drafts]))
            tau = int(rng.choice(k + 1, p=law.accepted[0] / law.accepted[0].sum()))
            emitted = law.emitted[0, tau] / law.emitted[0, tau].sum()
            out += [*drafts[:tau], int(rng.choice(world.vocab, p=emitted))]
            accepted += tau
            continue
        for j in range(k):
            p, q, x = ps[j], qs[j], drafts[j]
            if rng.random() < min(1.0, q[x] / p[x]):
                out.append(x)
                accepted += 1
                continue
            residual = np.maximum(q - p, 0.0)
            if defect == "residual-q" or residual.sum() <= 0:
                out.append(int(rng.choice(world.vocab, p=q)))
            elif defect == "residual-unnormalised":
                out.append(_inverse(rng.random(), residual))
            else:
                out.append(int(rng.choice(world.vocab, p=residual / residual.sum())))
            break
        else:  # every draft accepted: the bonus token
            bonus = world.p(c, i + k) if defect == "bonus-from-draft" else qs[k]
            out.append(int(rng.choice(world.vocab, p=bonus)))
    return out[:tokens], {"drafted": drafted, "accepted": accepted}


class FakeEngine(Engine):
    """The world as an engine in this process (llama-server's layout: the first token before any draft)."""

    first_drafted = 1
    drafted = "the first token from the verifier alone; drafts from the second on (a fake)"

    def __init__(self, world, defect="none", m=2):
        self.world, self.defect, self.m = world, defect, m

    def setting(self):
        return {"engine": "fake", "defect": self.defect, "m": self.m}

    def _position(self, prefix):
        return len(prefix) - CONTEXT, int(prefix[0])

    def rows(self, prefix):
        i, c = self._position(prefix)
        q, p = self.world.q(c, i), self.world.p(c, i)
        return ({t: float(v) for t, v in enumerate(q) if v > 0}, {t: float(v) for t, v in enumerate(p) if v > 0})

    def sample(self, context, tokens, seed):
        # as LlamaServerEngine asks: one token more than tested, so the last tested position can be drafted
        out, counters = speculative_sample(self.world, int(context[0]), tokens + 1, seed, self.defect, self.m)
        return out[:tokens], counters if tokens == self.first_drafted + 1 else None


def fake_llama_server(world, defect="none", m=2, *, drift=0.0, no_probs=False, stall=None, draft=False):
    """A handler for ``local_servers.FakeServer`` answering llama-server's ``/completion`` from the world:
    ``drift`` adds noise to the rows each time they are asked (a server whose rows move), ``no_probs`` leaves
    them out (n_probs ignored), ``stall`` sleeps that many seconds before a sample's answer; ``draft``: the draft
    model's server (its rows are p)."""
    import time

    asked = [0]

    def handler(method, path, body, headers):
        if path == "/props":
            return 200, {"model_path": "fake.gguf", "build_info": "fake"}
        if path != "/completion" or method != "POST":
            return 404, {"error": "not found"}
        prompt = body["prompt"]
        i, c = len(prompt) - CONTEXT, int(prompt[0])
        if body.get("n_probs", 0) > 0 and body.get("n_predict", 0) == 1:
            asked[0] += 1
            q = world.p(c, i) if draft else world.q(c, i)
            if drift:
                q = q * np.exp(np.random.default_rng(asked[0]).normal(0, drift, q.shape))
                q = q / q.sum()
            top = [{"id": t, "prob": float(v)} for t, v in enumerate(q) if v > 0]
            entry = {"id": top[0]["id"], "prob": top[0]["prob"]}
            if not no_probs:
                entry["top_probs"] = top
            return 200, {"tokens": [top[0]["id"]], "completion_probabilities": [entry], "timings": {}}
        if stall:
            time.sleep(stall)
        tokens, counters = speculative_sample(world, c, body["n_predict"], body["seed"], defect, m)
        timings = {"draft_n": counters["drafted"], "draft_n_accepted": counters["accepted"]}
        return 200, {"tokens": tokens, "timings": timings}

    return handler
