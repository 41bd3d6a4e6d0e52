"""Any token rule scored again from the exact referee's records, without a model (``rescore_exact``): the answer
rows the verifier alone's records keep (``_answer_rows``) give every rule's exact law of the answer token under any
sampler chain they confine, and from it the accuracy, KL and TV ``exact_answer_accuracy`` gives on the models' own
rows (to 1e-12)."""

from __future__ import annotations

import numpy as np

from .._math._sampling import SamplingSettings
from .._util._records import setting_difference
from ._referee_summary import ALONE, EXACT_KIND, read_exact_records

__all__ = ["exact_answer_accuracy", "rescore_exact"]


def exact_answer_accuracy(rule, draft_probs, target_probs, correct_ids, *, logits=None) -> dict:
    """The exact expected accuracy at the answer position: ``target_probs`` (q) mass on ``correct_ids``
    for the verifier alone (``rule`` None), else the mass of the law ``rule`` emits the position from
    (its slot-0 law over ``draft_probs``, p), with the drift it spends there: {"accuracy", "kl", "tv"}
    (float64; KL(pi || q) in nats)."""
    from .._laws._emitted import emitted_distribution
    from .._rules._protocol import judgement_of

    q = np.asarray(target_probs, dtype=np.float64)
    q = q / q.sum()
    correct = np.asarray(sorted(set(int(i) for i in correct_ids)), dtype=np.int64)
    if rule is None:
        return {"accuracy": float(q[correct].sum()), "kl": 0.0, "tv": 0.0}
    if not judgement_of(rule).per_token:
        raise ValueError(
            f"{rule.describe()} judges whole blocks or several drafts: the exact referee needs a token rule's law"
        )
    p = np.asarray(draft_probs, dtype=np.float64)
    p = p / p.sum()
    pi = np.asarray(emitted_distribution(rule.at_slot(0), p, q, logits=logits), dtype=np.float64)
    support = pi > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = float(np.sum(pi[support] * (np.log(pi[support]) - np.log(q[support]))))
    # a KL is never negative: a lossless rule's pi equals q to rounding, whose sum can fall a hair below 0
    return {"accuracy": float(pi[correct].sum()), "kl": max(kl, 0.0), "tv": float(0.5 * np.abs(pi - q).sum())}


def rescore_exact(records, rules, *, settings=None) -> list:
    """The exact referee's records of ``rules`` (token rules: specs or objects) under ``settings`` (the
    sampling and its chain; default: the records' own), scored again from the answer rows the verifier
    alone's records keep (``_quality_trace``), without a model: one record per problem and method, the
    verifier alone's first, as ``exact_choice_referee`` makes them (its accuracy, KL and TV to 1e-12 of the
    model run's, where the run's sampling is the same). ``records``: a list or the path of a records file.
    Their setting is kept but for its ``sampling``, and ``rescored`` (the sampling the rows were made with)."""
    from .._rules._registry import as_rule
    from ._answer_rows import read_answer_rows, rescored_laws

    if not isinstance(records, list):
        records = read_exact_records(records)
    alone = [r for r in records if r.get("method") == ALONE]
    if not alone:
        raise ValueError("records: none of the verifier alone, whose records keep the answer rows")
    missing = [r["id"] for r in alone if "rows" not in r]
    if missing:
        raise ValueError(
            f"records: {len(missing)} problem(s) (the first {missing[0]!r}) keep no answer rows (records made before "
            "the referee kept them): run the referee again to rescore them"
        )
    source = alone[0].get("setting") or {}
    made = SamplingSettings.from_dict(source.get("sampling"), "the records' setting.sampling")
    settings = settings or made
    rules = [as_rule(r) for r in rules]
    methods = [ALONE, *(r.describe() for r in rules)]
    if len(set(methods)) != len(methods):
        raise ValueError(f"the rules must be distinct; got {methods[1:]}")
    rows = [read_answer_rows(r["rows"], f"record of {r['id']!r}") for r in alone]
    vocabularies = sorted({r.vocab for r in rows})
    if len(vocabularies) > 1:  # another tokenizer's rows among them: never scored together
        other = next(rec["id"] for rec, r in zip(alone, rows, strict=True) if r.vocab != rows[0].vocab)
        raise ValueError(
            f"records: rows of vocabularies of {vocabularies} tokens (the first of another size: {other!r}): records "
            "of different tokenizers are never rescored together; rescore each model pair's records apart"
        )
    other = next((r for r in alone if (r.get("setting") or {}) != source), None)
    if other is not None:  # records of another run among them (another pair, sampling or benchmark)
        raise ValueError(
            f"records: the verifier alone's records hold different settings ({other['id']!r} against "
            f"{alone[0]['id']!r}: {setting_difference(source, other.get('setting') or {})}): rescore each run's "
            "records apart"
        )
    laws = rescored_laws(rows, rules, settings)
    setting = {**source, "sampling": settings.as_dict(), "rescored": made.as_dict()}
    out = []
    for i, rec in enumerate(alone):
        base = {k: rec[k] for k in ("id", "problem", "benchmark", "answer", "prompt_tokens") if k in rec}
        common = {
            "q_correct": float(laws[ALONE]["accuracy"][i]),
            "p_correct": float(laws[ALONE]["p_correct"][i]),
        }
        for method in methods:
            law = {k: float(laws[method][k][i]) for k in ("accuracy", "kl", "tv")}
            out.append({"record": EXACT_KIND, **base, "method": method, **law, **common, "setting": setting})
    return out
