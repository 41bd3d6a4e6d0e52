"""An oracle for engines (``conform``): does an engine's speculative sampling emit the law its rule promises?

For each context the oracle asks the engine (``Engine``) for its own processed rows (the verifier's law of the
next token under its sampler chain, and the drafter's where the engine gives it), computes from them the exact
law the claimed rule emits over the tested positions, draws N speculative samples with seeds varied, and tests
the empirical law against the exact one:

- **which positions**: an engine says which generated positions a draft can decide (``Engine.first_drafted``).
  llama-server samples the first token from the prompt's last row before any draft, so the oracle conditions on
  it: the context's most likely first token (the oracle picks contexts where it is nearly forced) is kept, the
  samples with another first token are set aside (counted), and the positions after it are tested. This
  package's decoders draft from the first token on.
- **the exact law**: for a lossless rule, the verifier's law of each tested position given the tokens before it
  (one row per prefix); for a token rule that is not, the law of its first drafted position, pi =
  ``emitted_distribution(rule.at_slot(0), p, q)``, and of the next one the mixture of its slot laws (drafted at
  slot 1 after an acceptance, at slot 0 after a correction; the verifier's bonus after m = 1 accepted draft).
  Block and multi-draft rules are taken where they are lossless.
- **the test**: the G test with a Monte Carlo p-value per context, contexts combined by the sum of their G's
  (``_math._multinomial``); per context and over all: the p-value, the total variation between the empirical
  and the exact law with a 95% interval for the engine's own (Weissman et al.'s bound: valid, wide), the power
  (the smallest total variation detected at 80% with the N kept, mass moved between the two most likely
  outcomes) and the N that would detect 0.02.
- **the counters**: where the engine reports its drafted and accepted counts, the acceptance of the first
  drafted position is compared with each candidate law (SpS with a sampled draft sum_x min(p, q); sampler
  match with a sampled draft sum_x p q; sampler match with a greedy draft q(argmax p); the claimed rule's
  sum_x p(x) a(x)), by a two-sided binomial test, and the consistent ones are named.

The oracle is a study (``ConformanceStudy``): one unit per context, resumable, on a Dask cluster as every study.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .._checks._engines import Engine, _law_row, candidate_acceptances, exact_tested_law
from .._math._multinomial import combined_test, detectable_tv, draws_for_tv, g_test, tv_with_interval
from .._util._results import Result
from .._util._study import Study, run_study

__all__ = [
    "KIND",
    "ConformanceResult",
    "ConformanceStudy",
    "Context",
    "DecoderEngine",
    "Engine",
    "choose_contexts",
    "conform",
    "exact_tested_law",
    "summarize_conformance",
]

#: The kind of record the oracle writes.
KIND = "cactus-theory conform"
#: Monte Carlo draws of each context's null law.
SIMS = 2000


class DecoderEngine(Engine):
    """This package's own decoders as an engine: the decoder ``decoder_for`` picks for ``spec`` (a ``DecodeSpec``
    with the rule, m, the sampling and the batch: HostChain, HostBatch or OnDevice) on ``verifier`` and ``draft``
    (loaded, or paths with ``load_options``), its rows the models' processed rows over the whole vocabulary and
    their raw logits, its samples ``spec.batch`` prompts of the same context at a time, each with its seed. A draft
    decides every position, the first in the first block; the counters are the first drafted position's."""

    first_drafted = 0
    drafted = "every generated position: the first token is the first block's first draft"

    def __init__(self, verifier, draft, spec, *, path="auto", load_options=None):
        from ._pair import ModelPair

        if spec.rule is None:
            raise ValueError("spec: give the rule the decoders run (DecodeSpec(rule=...))")
        if path not in ("auto", "chain", "batch"):
            raise ValueError(
                f"path must be 'auto' (decoder_for's choice), 'chain' (the host loop, one sequence) or 'batch' (the "
                f"host loop, a batch); got {path!r}"
            )
        self.spec, self.m, self.path = spec, spec.m, path
        self.pair = ModelPair(verifier, draft, load_options)

    def _decoder(self, spec):
        from .._models._decoding import batched_decoder, chain_decoder, decoder_for

        model, draft = self._models()
        if self.path == "batch":  # the host loop, however ready the device loop is
            return batched_decoder(spec, model, draft, device=False)
        return {"auto": decoder_for, "chain": chain_decoder}[self.path](spec, model, draft)

    def _models(self):
        from .._models._hf import split_model

        return self.pair.verifier[0], split_model(self.pair.draft)[0]

    def setting(self) -> dict:
        from .._models._hf import model_arithmetic, split_model

        model, draft = self._models()
        return {
            "engine": "cactus_theory",
            "decoder": type(self._decoder(self.spec)).__name__,
            "models": {"verifier": split_model(tuple(self.pair.verifier))[1], "draft": split_model(self.pair.draft)[1]},
            "arithmetic": {"verifier": model_arithmetic(model), "draft": model_arithmetic(draft)},
            "sampling": self.spec.settings.as_dict(),
            "m": self.spec.m,
            "batch": self.spec.batch,
        }

    def _raw(self, prefix):
        from .._models._prefix import NextTokenLogits

        key = tuple(int(t) for t in prefix)
        cache = self.__dict__.setdefault("_cache", {})
        if key not in cache:
            if "_next" not in self.__dict__:
                self._next = [NextTokenLogits(m) for m in self._models()]
            cache[key] = (self._next[0](list(key)), self._next[1](list(key)))
        return cache[key]

    def rows(self, prefix):
        from .._math._sampling import processed_probs

        q_raw, p_raw = self._raw(prefix)
        q = processed_probs(q_raw[None], self.spec.settings)[0]
        p = processed_probs(p_raw[None], self.spec.settings)[0]
        return dict(enumerate(q.tolist())), dict(enumerate(p.tolist()))

    def logits(self, prefix):
        from .._math._logits import RuleLogits

        q_raw, p_raw = self._raw(prefix)
        return np.arange(q_raw.size), RuleLogits(target=q_raw, draft=p_raw, temperature=self.spec.settings.temperature)

    def sample(self, context, tokens, seed):
        return self.sample_many(context, tokens, [seed])[0]

    def sample_many(self, context, tokens, seeds):
        import dataclasses

        spec = dataclasses.replace(self.spec, max_new_tokens=int(tokens))
        decoder = self._decoder(spec)
        out = []
        for start in range(0, len(seeds), spec.batch):
            group = list(seeds[start : start + spec.batch])
            for result in decoder.generate([list(context)] * len(group), group, ()):
                first = 1 if result.accepted and result.accepted[0] >= 1 else 0
                out.append(([int(t) for t in result.tokens[:tokens]], {"drafted": 1, "accepted": first}))
        return out


def _context_seed(seed, context_id, what) -> int:
    digest = hashlib.sha256(f"{seed}|{context_id}|{what}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class Context:
    """One tested context: its id and token ids."""

    id: str
    ids: tuple


class ConformanceStudy(Study):
    """The oracle as a study: one unit per context (``Context``), its record the exact law of the tested
    positions, the counts of N samples, the samples set aside by the conditioning, and the engine's counters."""

    kind: ClassVar[str] = KIND
    unit_name: ClassVar[str] = "context"

    def __init__(self, engine, rule, contexts, *, samples=1000, tokens=1, seed=0, condition=None, recheck=True):
        from .._math._validation import check_int
        from .._rules._registry import as_rule

        self.engine, self.rule = engine, as_rule(rule)
        self.samples = check_int(samples, "samples", 1, what="speculative samples per context")
        self.tokens = check_int(tokens, "tokens", 1, high=3, what="positions tested after the first drafted")
        self.seed = check_int(seed, "seed", 0)
        self.contexts = [
            c if isinstance(c, Context) else Context(str(c[0]), tuple(int(t) for t in c[1])) for c in contexts
        ]
        if not self.contexts:
            raise ValueError("contexts: give at least one context")
        if len({c.id for c in self.contexts}) != len(self.contexts):
            raise ValueError("contexts: their ids must be distinct")
        #: Positions before the first drafted one are conditioned on: None, the engine's most likely token(s).
        self.condition = condition
        self.recheck = bool(recheck)

    def setting(self) -> dict:
        return {
            "engine": self.engine.setting(),
            "rule": self.rule.describe(),
            "samples": self.samples,
            "tokens": self.tokens,
            "seed": self.seed,
            "first_drafted": self.engine.first_drafted,
        }

    def units(self) -> list:
        return self.contexts

    def unit_keys(self, context) -> list:
        return [(context.id,)]

    def key(self, record) -> tuple:
        return (record["context"],)

    def _prefix(self, context):
        """The conditioned prefix: the most likely token at each position before the first drafted one."""
        prefix = list(context.ids)
        for _ in range(self.engine.first_drafted):
            ids, probs = _law_row(self.engine.rows(prefix)[0], f"context {context.id}: the first row")
            prefix.append(int(ids[int(np.argmax(probs))]))
        return prefix

    def run_unit(self, context, held) -> list:
        prefix = self._prefix(context)
        forced = prefix[len(context.ids) :]
        law = exact_tested_law(self.engine, self.rule, prefix, self.tokens, self.engine.m)
        first_row = self.engine.rows(list(context.ids))[0]
        counts, set_aside, drafted, accepted, counted = {}, 0, 0, 0, 0
        want = self.engine.first_drafted + self.tokens
        seeds = [_context_seed(self.seed, context.id, s) for s in range(self.samples)]
        for tokens, counters in self.engine.sample_many(list(context.ids), want, seeds):
            if len(tokens) < want:
                raise ValueError(f"context {context.id}: the engine stopped after {len(tokens)} of {want} tokens")
            if list(tokens[: len(forced)]) != forced:
                set_aside += 1
                continue
            key = ",".join(str(int(t)) for t in tokens[len(forced) : want])
            counts[key] = counts.get(key, 0) + 1
            if counters is not None:
                counted += 1
                drafted += int(counters.get("drafted", 0))
                accepted += int(counters.get("accepted", 0))
        record = {
            "context": context.id,
            "context_tokens": len(context.ids),
            "forced": forced,
            "law": [[",".join(map(str, k)), v] for k, v in sorted(law.items())],
            "counts": sorted(counts.items()),
            "kept": sum(counts.values()),
            "set_aside": set_aside,
            "forced_probability": float(law_first(first_row, forced)),
        }
        if counted:
            record["counters"] = {"requests": counted, "drafted": drafted, "accepted": accepted}
            record["candidates"] = candidate_acceptances(self.engine, self.rule, prefix)
        if self.recheck:  # the same context asked again: an engine whose rows move is flagged, never trusted
            self.engine.forget()
            again = exact_tested_law(self.engine, self.rule, prefix, self.tokens, self.engine.m)
            keys = set(law) | set(again)
            record["row_drift"] = 0.5 * sum(abs(law.get(k, 0.0) - again.get(k, 0.0)) for k in keys)
        return [record]

    def summarize(self, records):
        return summarize_conformance(records)

    def close(self) -> None:
        self.engine.close()

    @property
    def label(self) -> str:
        return "conform"

    def __getstate__(self):
        state = super().__getstate__()
        if hasattr(self.engine, "for_worker"):
            state["engine"] = self.engine.for_worker()
        return state


def law_first(row, forced) -> float:
    """The probability the row gives the first forced token (1 where nothing is forced)."""
    if not forced:
        return 1.0
    return float({int(k): float(v) for k, v in row.items()}.get(int(forced[0]), 0.0))


def _binomial_p(k, n, rate) -> float:
    """Two-sided exact binomial p-value of k successes in n at ``rate``."""
    from scipy import stats

    if n == 0:
        return float("nan")
    return float(stats.binomtest(int(k), int(n), min(max(rate, 0.0), 1.0)).pvalue)


@dataclass(frozen=True)
class ConformanceResult(Result):
    """The oracle's verdict: ``rows`` per context (p-value, TV with its interval, the power, the N for a TV of
    0.02, the samples kept and set aside, the counters and the consistent acceptance laws), ``overall`` (the
    combined p-value, its verdict at ``alpha``, the median power), ``alpha``."""

    rows: list
    overall: dict
    alpha: float = 0.01
    notes: list = field(default_factory=list)
    name = "conform"

    def records(self) -> list:
        return [dict(r) for r in self.rows]

    def to_json(self) -> str:
        """The rows with the verdict over all contexts (``overall``), the level and the notes."""
        import json

        from .._util._results import json_ready

        data = {"name": self.name, "rows": self.records(), "overall": self.overall, "alpha": self.alpha}
        return json.dumps(json_ready({**data, "notes": list(self.notes)}), indent=1)

    def table(self) -> str:
        o = self.overall
        lines = [
            f"{'context':<18} {'kept':>6} {'aside':>6} {'p-value':>8} {'TV [95%]':>24} {'detects TV':>10} "
            f"{'N for 0.02':>10}  acceptance consistent with",
        ]
        for r in self.rows:
            consistent = ", ".join(r.get("consistent", [])) if "consistent" in r else "-"
            lines.append(
                f"{r['context']:<18} {r['kept']:>6} {r['set_aside']:>6} {r['p_value']:>8.3g} "
                f"{r['tv']:>8.4f} [{r['tv_low']:.4f}, {r['tv_high']:.4f}] {r['detectable_tv']:>10.4f} "
                f"{r['n_for_002']:>10,.0f}  {consistent}"
            )
        lines += [
            "",
            f"all {o['contexts']} contexts: sum of G {o['g']:.1f}, p = {o['p_value']:.3g} (Monte Carlo, {SIMS} draws "
            f"per context): {o['verdict']} at alpha = {self.alpha:g}; the test detects a TV of "
            f"{o['median_detectable_tv']:.4f} per context at 80% (median over contexts)",
        ]
        if o.get("consistent"):
            lines.append(f"the engine's acceptance counts are consistent with: {', '.join(o['consistent'])}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def summarize_conformance(records, *, alpha=0.01) -> ConformanceResult:
    """The oracle's verdict from its records alone (see the module docstring)."""
    rows, stats, nulls, notes = [], [], [], []
    pooled = {}
    for rec in sorted(records, key=lambda r: str(r["context"])):
        law = {k: float(v) for k, v in rec["law"]}
        counts = dict(rec["counts"])
        keys = sorted(set(law) | set(counts))
        p = np.array([law.get(k, 0.0) for k in keys])
        c = np.array([counts.get(k, 0) for k in keys], dtype=np.float64)
        seed = _context_seed(0, rec["context"], "null")
        if c.sum() == 0:
            raise ValueError(f"context {rec['context']}: no sample kept (its forced first token never came)")
        g, pv, null = g_test(c, p / p.sum(), sims=SIMS, seed=seed)
        tv, low, high = tv_with_interval(c, p / p.sum())
        row = {
            "context": rec["context"],
            "kept": int(rec["kept"]),
            "set_aside": int(rec["set_aside"]),
            "categories": int(np.sum(p > 0)),
            "g": g,
            "p_value": pv,
            "tv": tv,
            "tv_low": low,
            "tv_high": high,
            "detectable_tv": detectable_tv(p, c.sum(), alpha=alpha),
            "n_for_002": draws_for_tv(p, 0.02, alpha=alpha),
            "row_drift": rec.get("row_drift"),
        }
        if rec.get("row_drift") is not None and rec["row_drift"] > 1e-6:
            notes.append(
                f"context {rec['context']}: the engine reported other rows for the same context when asked again "
                f"(TV {rec['row_drift']:.2g} between the two laws): its verdict is not to be trusted"
            )
        if "counters" in rec:
            row["drafted"], row["accepted"] = rec["counters"]["drafted"], rec["counters"]["accepted"]
        if "counters" in rec and rec.get("candidates"):
            counters = rec["counters"]
            row["consistent"] = [
                name
                for name, rate in rec["candidates"].items()
                if _binomial_p(counters["accepted"], counters["drafted"], rate) > alpha
            ]
            for name, rate in rec["candidates"].items():
                pooled.setdefault(name, []).append((counters["accepted"], counters["drafted"], rate))
        rows.append(row)
        stats.append(g)
        nulls.append(null)
    g_all, p_all = combined_test(stats, nulls)
    overall = {
        "contexts": len(rows),
        "g": g_all,
        "p_value": p_all,
        "verdict": "emits the claimed law (not rejected)" if p_all > alpha else "does NOT emit the claimed law",
        "median_detectable_tv": _median([r["detectable_tv"] for r in rows]),
        "kept": int(sum(r["kept"] for r in rows)),
    }
    if pooled:  # the counts of all contexts against each candidate: expected accepted vs observed (a normal test)
        consistent = []
        for name, parts in pooled.items():
            k = sum(a for a, _, _ in parts)
            mean = sum(n * r for _, n, r in parts)
            var = sum(n * r * (1 - r) for _, n, r in parts)
            z = (k - mean) / math.sqrt(var) if var > 0 else (0.0 if k == mean else math.inf)
            from scipy import stats as _stats

            if 2 * _stats.norm.sf(abs(z)) > alpha:
                consistent.append(name)
        overall["consistent"] = consistent
    return ConformanceResult(rows, overall, alpha, notes)


def choose_contexts(engine, prompts, count, *, forced=0.9, informative=0.99) -> tuple:
    """(the first ``count`` contexts of ``prompts`` ([(id, token ids)]) fit for the oracle, [(id, why another was
    passed over)]): where the engine samples positions before its first drafted one, the most likely token there
    must hold at least ``forced`` of the mass (few samples set aside), and the first tested position's law must
    not be one token at more than ``informative`` (a near-certain token tests nothing)."""
    chosen, skipped = [], []
    for context_id, ids in prompts:
        prefix, mass = list(ids), 1.0
        for _ in range(engine.first_drafted):
            row = engine.rows(prefix)[0]
            best = max(row, key=row.get)
            mass *= row[best]
            prefix.append(int(best))
        if mass < forced:
            skipped.append((context_id, f"its first token is not nearly forced ({mass:.2f} < {forced:g})"))
            continue
        tested = engine.rows(prefix)[0]
        if max(tested.values()) > informative:
            skipped.append((context_id, f"its tested token is nearly certain ({max(tested.values()):.3f})"))
            continue
        chosen.append(Context(str(context_id), tuple(int(t) for t in ids)))
        if len(chosen) == count:
            break
    return chosen, skipped


def _median(values) -> float:
    """The median of the finite values (NaN where none is: every context's law one outcome)."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.median(finite)) if finite else float("nan")


def conform(engine, rule, contexts, *, samples=1000, tokens=1, seed=0, out=None, progress=None, client=None):
    """Run the oracle (``ConformanceStudy``) on ``engine`` for ``rule`` at ``contexts`` ([(id, token ids)] or
    ``Context``s) and return its verdict (``ConformanceResult``; see the module docstring)."""
    study = ConformanceStudy(engine, rule, contexts, samples=samples, tokens=tokens, seed=seed)
    records = run_study(study, out=out, progress=progress, client=client)
    return summarize_conformance(records)
