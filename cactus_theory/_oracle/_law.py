"""The exact law the oracle holds an engine's samples to (``exact_tested_law``), from the rows the engine itself
reports, and the acceptance each candidate law of verification predicts for one drafted token
(``candidate_acceptances``)."""

from __future__ import annotations

import numpy as np

from ._engine import law_row, on_support

__all__ = ["candidate_acceptances", "exact_tested_law"]


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
        ids_q, q = law_row(q_row[0], f"the verifier's row after {len(prefix)} tokens")
        if lossless:
            return ids_q, q, None, None
        if q_row[1] is None:
            raise ValueError(
                f"{rule.describe()} is not lossless: its law needs the drafter's rows, which this engine "
                "does not report (give a draft server)"
            )
        ids_p, p = law_row(q_row[1], f"the drafter's row after {len(prefix)} tokens")
        support, pp, qq = on_support(ids_p, p, ids_q, q)
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
            ids_bonus, bonus = law_row(engine.rows([*base, x])[0], "the bonus row")
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
    ids_q, q = law_row(q_row, "the verifier's row")
    ids_p, p = law_row(p_row, "the drafter's row")
    _, pp, qq = on_support(ids_p, p, ids_q, q)
    greedy = int(np.argmax(pp))
    out = {
        "SpS (sampled draft)": float(np.minimum(pp, qq).sum()),
        "sampler-match (sampled draft)": float(pp @ qq),
        "sampler-match (greedy draft)": float(qq[greedy]),
    }
    if not rule.needs_logits:
        out[f"{rule.describe()} (sampled draft)"] = float(pp @ np.asarray(rule.acceptance_all(pp, qq)))
    return out
