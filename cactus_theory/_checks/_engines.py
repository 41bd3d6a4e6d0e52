"""What the engine oracle asks of an engine (``Engine``), and the exact law it holds an engine's samples to
(``exact_tested_law``), from the rows the engine itself reports; the acceptance each candidate law predicts
(``candidate_acceptances``). The oracle that runs them, draws the samples and tests them is
``_studies._conform``; engines: ``_servers._conform_engine.LlamaServerEngine`` (a running llama-server),
``_studies._conform.DecoderEngine`` (this package's decoders)."""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

__all__ = ["MAX_MISSING", "Engine", "candidate_acceptances", "exact_tested_law"]

#: A reported row whose probabilities sum to less than 1 by more than this left mass out (top-N too small).
MAX_MISSING = 1e-3


class Engine(abc.ABC):
    """What the oracle asks of an engine: its rows (the processed law of the next token after a prefix, as the
    engine reports it), and speculative samples of a few tokens after a context, with the engine's drafted and
    accepted counts where it reports them.

    ``first_drafted``: the first generated position (0-based) a draft can decide; ``drafted``: that said in
    words, for the page; ``m``: drafts a step (None: the engine's own, unknown here)."""

    first_drafted: ClassVar[int] = 0
    drafted: ClassVar[str] = "every generated position, the first in the first block"
    m: int | None = None

    @abc.abstractmethod
    def setting(self) -> dict:
        """What decides the engine's law besides the context: its models, sampler, drafting (for the records)."""

    @abc.abstractmethod
    def rows(self, prefix) -> tuple:
        """({token: probability} of the verifier's processed law after ``prefix`` (token ids), {token: probability}
        of the drafter's or None): the engine's own report."""

    @abc.abstractmethod
    def sample(self, context, tokens, seed) -> tuple:
        """(the first ``tokens`` generated token ids after ``context``, by speculative decoding seeded by
        ``seed``; {"drafted": n, "accepted": n} of that request, or None where the engine reports none)."""

    def sample_many(self, context, tokens, seeds) -> list:
        """``sample`` for each seed of ``seeds`` (an engine that decodes several at once overrides it)."""
        return [self.sample(context, tokens, seed) for seed in seeds]

    def logits(self, prefix):
        """The raw logits after ``prefix`` as a ``RuleLogits`` over the same tokens as ``rows`` (sorted ids), for
        the rules that read them; None where the engine does not give them (an HTTP server's rows)."""
        return None

    def forget(self) -> None:
        """Drop the rows the engine keeps, so that the next ask goes to the engine again (the recheck)."""
        self.__dict__.pop("_rows", None)
        self.__dict__.pop("_cache", None)

    def close(self) -> None:
        return None


def _law_row(row, where):
    """A reported row as (ids, probabilities), checked: probabilities in [0, 1] summing to 1 within
    ``MAX_MISSING``."""
    if not isinstance(row, dict) or not row:
        raise ValueError(f"{where}: the engine reported no probabilities (does it give n_probs / logprobs?)")
    ids = np.array(sorted(row), dtype=np.int64)
    probs = np.array([float(row[i]) for i in ids], dtype=np.float64)
    if not np.all(np.isfinite(probs)) or np.any(probs < 0) or np.any(probs > 1 + 1e-9):
        raise ValueError(f"{where}: the engine reported probabilities outside [0, 1] (or NaN)")
    total = float(probs.sum())
    if total < 1 - MAX_MISSING:
        raise ValueError(
            f"{where}: the reported probabilities sum to {total:.6f}: the top-N the engine returns leaves "
            f"{1 - total:.2g} of the law out (more than {MAX_MISSING:g}); ask for more (n_probs) or a smaller top-k"
        )
    if total > 1 + MAX_MISSING:
        raise ValueError(f"{where}: the reported probabilities sum to {total:.6f} > 1: not a law")
    return ids, probs / total


def _on_support(ids_p, p, ids_q, q):
    """(support, p, q) of two reported rows on the union of their tokens."""
    support = np.union1d(ids_q, ids_p if ids_p is not None else ids_q)
    qq = np.zeros(support.size)
    qq[np.searchsorted(support, ids_q)] = q
    if ids_p is None:
        return support, None, qq
    pp = np.zeros(support.size)
    pp[np.searchsorted(support, ids_p)] = p
    return support, pp, qq


def exact_tested_law(engine, rule, base, tokens, m=None) -> dict:
    """{tuple of tokens: probability} of the ``tokens`` tested positions after the prefix ``base`` (token ids)
    under ``rule``, from the engine's rows (see the module docstring): the verifier's law where the rule is
    lossless; for a token rule, pi at the first drafted position and, for a second, the mixture of its slot
    laws (the verifier's bonus after one accepted draft when ``m`` is 1)."""
    from .._laws._emitted import emitted_distribution
    from .._rules._protocol import judgement_of

    lossless = bool(rule.lossless)
    if not lossless and not judgement_of(rule).per_token:
        raise ValueError(
            f"{rule.describe()} judges whole blocks or several drafts and is not lossless: the oracle "
            "tests a token rule's law, or a lossless rule's"
        )
    if not lossless and tokens > 2:
        raise ValueError("the oracle tests at most two positions of a rule that is not lossless")

    def laws(prefix, slot):
        q_row = engine.rows(prefix)
        ids_q, q = _law_row(q_row[0], f"the verifier's row after {len(prefix)} tokens")
        if lossless:
            return ids_q, q, None, None
        if q_row[1] is None:
            raise ValueError(
                f"{rule.describe()} is not lossless: its law needs the drafter's rows, which this engine "
                "does not report (give a draft server)"
            )
        ids_p, p = _law_row(q_row[1], f"the drafter's row after {len(prefix)} tokens")
        support, pp, qq = _on_support(ids_p, p, ids_q, q)
        lg = None
        if rule.needs_logits:
            lg = engine.logits(prefix)
            if lg is None or lg[0].shape != support.shape or np.any(lg[0] != support):
                raise ValueError(f"{rule.describe()} reads raw logits, which this engine's reported rows do not hold")
            lg = lg[1]
        judged = rule.at_slot(slot)
        pi = np.asarray(emitted_distribution(judged, pp, qq, logits=lg), dtype=np.float64)
        accept = np.asarray(judged.acceptance_all(pp, qq, logits=lg), dtype=np.float64)
        return support, pi, pp, accept

    out = {}
    first_ids, first, p1, a1 = laws(list(base), 0)
    for x, w in zip(first_ids.tolist(), first.tolist(), strict=True):
        if w <= 0:
            continue
        if tokens == 1:
            out[(x,)] = out.get((x,), 0.0) + w
            continue
        if lossless:
            ids2, law2, _, _ = laws([*base, x], 0)
            rest = exact_tested_law(engine, rule, [*base, x], tokens - 1) if tokens > 2 else None
            if rest is not None:
                for tail, v in rest.items():
                    out[(x, *tail)] = out.get((x, *tail), 0.0) + w * v
                continue
            for y, v in zip(ids2.tolist(), law2.tolist(), strict=True):
                if v > 0:
                    out[(x, y)] = out.get((x, y), 0.0) + w * v
            continue
        i = int(np.searchsorted(first_ids, x))
        accepted = float(p1[i] * a1[i])  # x emitted as the accepted draft: the next position is slot 1
        ids_next, after_correction, _, _ = laws([*base, x], 0)
        if m == 1:  # one draft a step: after it is accepted, the verifier's bonus
            ids_bonus, bonus = _law_row(engine.rows([*base, x])[0], "the bonus row")
            after_accept = dict(zip(ids_bonus.tolist(), bonus.tolist(), strict=True))
        else:
            ids_1, law_1, _, _ = laws([*base, x], 1)
            after_accept = dict(zip(ids_1.tolist(), law_1.tolist(), strict=True))
        after_reject = dict(zip(ids_next.tolist(), after_correction.tolist(), strict=True))
        for y in set(after_accept) | set(after_reject):
            v = accepted * after_accept.get(y, 0.0) + (w - accepted) * after_reject.get(y, 0.0)
            if v > 0:
                out[(x, y)] = out.get((x, y), 0.0) + v
    total = sum(out.values())
    return {k: v / total for k, v in out.items()}


def candidate_acceptances(engine, rule, prefix) -> dict:
    """The expected acceptance of one drafted token after ``prefix`` under each candidate law (needs the
    drafter's row): {"SpS (sampled draft)", "sampler-match (sampled draft)", "sampler-match (greedy draft)",
    "<the claimed rule> (sampled draft)"}."""
    q_row, p_row = engine.rows(prefix)
    if p_row is None:
        return {}
    ids_q, q = _law_row(q_row, "the verifier's row")
    ids_p, p = _law_row(p_row, "the drafter's row")
    _, pp, qq = _on_support(ids_p, p, ids_q, q)
    greedy = int(np.argmax(pp))
    out = {
        "SpS (sampled draft)": float(np.minimum(pp, qq).sum()),
        "sampler-match (sampled draft)": float(pp @ qq),
        "sampler-match (greedy draft)": float(qq[greedy]),
    }
    if not rule.needs_logits:
        out[f"{rule.describe()} (sampled draft)"] = float(pp @ np.asarray(rule.acceptance_all(pp, qq)))
    return out
