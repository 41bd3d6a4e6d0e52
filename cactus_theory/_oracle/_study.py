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

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._util._study import Study, run_study
from ._engine import law_row
from ._law import candidate_acceptances, exact_tested_law
from ._verdict import context_seed, summarize_conformance

__all__ = ["KIND", "ConformanceStudy", "Context", "choose_contexts", "conform"]

#: The kind of record the oracle writes.
KIND = "cactus-theory conform"


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
    outside_setting: ClassVar[dict] = {
        "contexts": "the units: each record names its context",
        "engine": "prepare() gives its setting (its models, sampler and drafting)",
    }
    summary_options: ClassVar[dict] = {"alpha": 0.01}

    def __init__(self, engine, rule, contexts, *, samples=1000, tokens=1, seed=0, recheck=True):
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
        #: The positions before the first drafted one, conditioned on (the engine's most likely token there).
        self.first_drafted = int(engine.first_drafted)
        self.recheck = bool(recheck)

    def prepare(self) -> dict:
        return {"engine": self.engine.setting()}

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
            ids, probs = law_row(self.engine.rows(prefix)[0], f"context {context.id}: the first row")
            prefix.append(int(ids[int(np.argmax(probs))]))
        return prefix

    def run_unit(self, context, held) -> list:
        prefix = self._prefix(context)
        forced = prefix[len(context.ids) :]
        law = exact_tested_law(self.engine, self.rule, prefix, self.tokens, self.engine.m)
        first_row = self.engine.rows(list(context.ids))[0]
        counts, set_aside, drafted, accepted, counted = {}, 0, 0, 0, 0
        want = self.engine.first_drafted + self.tokens
        seeds = [context_seed(self.seed, context.id, s) for s in range(self.samples)]
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

    def summarize(self, records, *, alpha=0.01):
        return summarize_conformance(records, alpha=alpha)

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


def choose_contexts(engine, prompts, count, *, forced=0.9, informative=0.99) -> tuple:
    """(the first ``count`` contexts of ``prompts`` ([(id, token ids)]) fit for the oracle, [(id, why another was
    passed over)]): where the engine samples positions before its first drafted one, the most likely token there
    must hold at least ``forced`` of the mass (few samples set aside), and the first tested position's law must
    not be one token at more than ``informative`` (a near-certain token tests nothing)."""
    chosen, skipped = [], []
    for context_id, ids in prompts:
        prefix, mass = list(ids), 1.0
        for _ in range(engine.first_drafted):  # each row checked as a law first: a broken row is its own error
            tokens, probs = law_row(engine.rows(prefix)[0], f"context {context_id}: the row after {len(prefix)} tokens")
            mass *= float(probs.max())
            prefix.append(int(tokens[int(np.argmax(probs))]))
        if mass < forced:
            skipped.append((context_id, f"its first token is not nearly forced ({mass:.2f} < {forced:g})"))
            continue
        _, tested = law_row(engine.rows(prefix)[0], f"context {context_id}: the tested row")
        if tested.max() > informative:
            skipped.append((context_id, f"its tested token is nearly certain ({tested.max():.3f})"))
            continue
        chosen.append(Context(str(context_id), tuple(int(t) for t in ids)))
        if len(chosen) == count:
            break
    return chosen, skipped


def conform(engine, rule, contexts, *, samples=1000, tokens=1, seed=0, out=None, progress=None, client=None):
    """Run the oracle (``ConformanceStudy``) on ``engine`` for ``rule`` at ``contexts`` ([(id, token ids)] or
    ``Context``s) and return its verdict (``ConformanceResult``; see the module docstring)."""
    study = ConformanceStudy(engine, rule, contexts, samples=samples, tokens=tokens, seed=seed)
    records = run_study(study, out=out, progress=progress, client=client)
    return study.summarize(records)
