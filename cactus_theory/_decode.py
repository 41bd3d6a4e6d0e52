"""Real speculative decoding with Hugging Face causal LMs and any acceptance rule (batch size 1).

Both distributions are processed with the same sampling settings (temperature, top-k, top-p)
before the rule sees them, as in vLLM and the paper; temperature 0 is greedy. The verifier
checks m drafted tokens in one forward pass; after a rejection both KV caches are cropped back
to the accepted prefix.
"""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass, field

import numpy as np

from ._rules._base import BONUS_POLICIES, RuleLogits, as_rule
from ._sampling import SamplingSettings, processed_probs

__all__ = ["DecodeResult", "NgramDrafter", "autoregressive_generate", "speculative_generate"]


@dataclass
class DecodeResult:
    """Tokens emitted, and per verification step the drafted and accepted counts."""

    tokens: list
    drafted: list = field(default_factory=list)
    accepted: list = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def accepted_length(self) -> float:
        """AL: accepted draft tokens per verification step (PAPER.md section 5)."""
        return float(np.mean(self.accepted)) if self.accepted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's mean acceptance length: 1 + AL."""
        return 1.0 + self.accepted_length

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.total_seconds if self.total_seconds > 0 else float("nan")


@dataclass(frozen=True)
class NgramDrafter:
    """Prompt lookup: propose the tokens that followed the latest earlier occurrence of the last
    n-gram (n from ``max_ngram`` down to ``min_ngram``) in the prompt and output so far.
    No draft probabilities: the rule sees a one-hot draft distribution."""

    max_ngram: int = 3
    min_ngram: int = 1

    def propose(self, context: list, m: int) -> list:
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) <= n:
                continue
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):
                if context[start : start + n] == tail:
                    follow = context[start + n : start + n + m]
                    if follow:
                        return list(follow)
        return []


def _device(model):
    return next(model.parameters()).device


@functools.cache
def _takes_cache(model_class) -> bool:
    return "cache" in inspect.signature(model_class.forward).parameters


def _forward(model, ids, cache):
    """One cached forward pass: (logits, new cache). transformers >= 5.x names the cache
    argument and output ``cache``; earlier versions ``past_key_values`` (kept where needed)."""
    if _takes_cache(type(model)):
        out = model(input_ids=ids, cache=cache, use_cache=True)
    else:
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    new = getattr(out, "cache", None)
    return out.logits, new if new is not None else out.past_key_values


class _Cached:
    """A model with a KV cache over a growing token list."""

    def __init__(self, model):
        import torch

        self.model, self.torch = model, torch
        self.cache = None
        self.length = 0  # tokens in the cache

    def feed(self, tokens):
        """Run the model on ``tokens`` after the cached prefix; logits (len, V) float32."""
        torch = self.torch
        ids = torch.tensor([list(tokens)], device=_device(self.model))
        with torch.no_grad():
            logits, self.cache = _forward(self.model, ids, self.cache)
        self.length += len(tokens)
        return logits[0].float()

    def crop(self, length):
        """Keep the first ``length`` cached tokens (transformers 5: crop takes a negative count)."""
        if length < self.length:
            try:
                self.cache.crop(length - self.length)
            except ValueError:  # transformers 4.x: crop(max_length) keeps that many
                self.cache.crop(length)
            self.length = length


def _sample(probs, generator):
    import torch

    return int(torch.multinomial(probs.double().cpu(), 1, generator=generator)[0])


def _rule_step(rule, p_row, q_row, token, logits, coin, gen):
    """Accept ``token`` with the rule's probability, else sample its correction: (accepted?, token)."""
    if coin.random() < float(rule.acceptance(p_row, q_row, token, logits=logits)):
        return True, token
    r = np.asarray(rule.correction(p_row, q_row, token, logits=logits), dtype=np.float64)
    import torch

    return False, _sample(torch.as_tensor(r), gen)


def autoregressive_generate(model, prompt_ids, sampling=None, max_new_tokens=128, seed=0, eos_ids=()):
    """The verifier alone: the baseline for accuracy and wall time (same sampling code path)."""
    import torch

    sampling = sampling or SamplingSettings()
    gen = torch.Generator().manual_seed(seed)
    runner = _Cached(model)
    start = time.perf_counter()
    logits = runner.feed(prompt_ids)[-1]
    tokens = []
    for _ in range(max_new_tokens):
        token = _sample(processed_probs(logits[None], sampling)[0], gen)
        tokens.append(token)
        if token in eos_ids:
            break
        logits = runner.feed([token])[-1]
    elapsed = time.perf_counter() - start
    return DecodeResult(tokens=tokens, verify_seconds=elapsed, total_seconds=elapsed)


def speculative_generate(
    verifier,
    draft,
    rule,
    m,
    sampling=None,
    max_new_tokens=128,
    seed=0,
    prompt_ids=(),
    eos_ids=(),
    *,
    bonus_policy="verifier",
):
    """Speculative decoding of ``prompt_ids`` with ``rule``; ``draft`` is a causal LM or an ``NgramDrafter``.

    Per step: draft m tokens (sampling from the processed draft distribution p), verify them in
    one forward pass of the verifier (processed q), accept in order with the rule's acceptance
    probability (the draft at slot j judged by ``rule.at_slot(j)``), sample the rule's
    correction token after the first rejection, or a bonus token when all m are accepted: from
    q (``bonus_policy="verifier"``) or, under ``"relaxed"``, by one more step of the rule with
    the drafter's distribution at the bonus position (one extra draft forward pass; needs a
    draft model). Rules that need raw logits get both models' full rows. Returns a
    ``DecodeResult`` with timings.
    """
    import torch

    rule = as_rule(rule)
    sampling = sampling or SamplingSettings()
    if not (isinstance(m, int) and m >= 1):
        raise ValueError(f"m (drafted tokens per verification) must be an integer >= 1; got {m!r}")
    if bonus_policy not in BONUS_POLICIES:
        raise ValueError(f"bonus_policy must be one of {BONUS_POLICIES}; got {bonus_policy!r}")
    if isinstance(draft, NgramDrafter) and (bonus_policy == "relaxed" or "draft" in rule.needs_logits):
        raise ValueError(
            f"{rule.describe()} with bonus_policy={bonus_policy!r} needs a draft model with probabilities and "
            "logits; the n-gram drafter has none"
        )
    need_logits = bool(rule.needs_logits)
    gen = torch.Generator().manual_seed(seed)
    coin = np.random.default_rng(seed)
    ver = _Cached(verifier)
    ngram = isinstance(draft, NgramDrafter)
    drf = None if ngram else _Cached(draft)
    context = list(prompt_ids)
    result = DecodeResult(tokens=[])
    start = time.perf_counter()
    # verifier and draft caches hold every context token but the last; the last is fed each step
    if len(context) < 1:
        raise ValueError("prompt_ids must hold at least one token")
    if len(context) > 1:
        ver.feed(context[:-1])
        if drf is not None:
            drf.feed(context[:-1])
    while len(result.tokens) < max_new_tokens:
        budget = min(m, max_new_tokens - len(result.tokens))
        t0 = time.perf_counter()
        drafted, draft_rows, draft_raw = [], [], []
        if ngram:
            drafted = draft.propose(context, budget)
        else:
            feed = [context[-1]]
            for _ in range(budget):
                raw = drf.feed(feed)[-1]
                p = processed_probs(raw[None], sampling)[0]
                token = _sample(p, gen)
                drafted.append(token)
                draft_rows.append(p.double().cpu().numpy())
                if need_logits:
                    draft_raw.append(raw.double().cpu().numpy())
                feed = [token]
        t1 = time.perf_counter()
        q_raw = ver.feed([context[-1], *drafted])
        q_rows = processed_probs(q_raw, sampling).double().cpu().numpy()
        q_raw = q_raw.double().cpu().numpy() if need_logits else None
        t2 = time.perf_counter()

        def step(slot, p_row, token, p_raw, q_rows=q_rows, q_raw=q_raw):
            """The rule at slot ``slot``: (accepted?, the token emitted)."""
            logits = None
            if need_logits:
                logits = RuleLogits(target=q_raw[slot], draft=p_raw, temperature=sampling.temperature)
            return _rule_step(rule.at_slot(slot), p_row, q_rows[slot], token, logits, coin, gen)

        n_acc, emitted = 0, []
        for j, token in enumerate(drafted):
            ok, out = step(j, draft_rows[j] if draft_rows else None, token, draft_raw[j] if draft_raw else None)
            emitted.append(out)
            if not ok:
                break
            n_acc += 1
            if token in eos_ids:
                break
        else:
            if bonus_policy == "verifier" or not drafted:
                emitted.append(_sample(torch.as_tensor(q_rows[len(drafted)]), gen))  # bonus from q
            else:  # relaxed: the drafter drafts at the bonus position, the rule judges once more
                raw = drf.feed([drafted[-1]])[-1]
                p = processed_probs(raw[None], sampling)[0]
                token = _sample(p, gen)
                p_raw = raw.double().cpu().numpy() if need_logits else None
                emitted.append(step(len(drafted), p.double().cpu().numpy(), token, p_raw)[1])
        result.drafted.append(len(drafted))
        result.accepted.append(n_acc)
        result.draft_seconds += t1 - t0
        result.verify_seconds += t2 - t1
        # Caches keep the old context and the accepted drafts; the last emitted token is fed
        # next step. The draft cache lacks d_m when all m drafts were accepted: feed it.
        keep = len(context) + n_acc
        ver.crop(keep)
        if drf is not None:
            if drf.length < keep:
                drf.feed(drafted[drf.length - len(context) : n_acc])
            drf.crop(keep)
        emitted = emitted[: max_new_tokens - len(result.tokens)]
        context.extend(emitted)
        result.tokens.extend(emitted)
        if any(t in eos_ids for t in emitted):
            break
    result.total_seconds = time.perf_counter() - start
    return result
