"""The exact quality referee, where one token decides: for a multiple-choice problem asked at the answer
position (the prompt ends in "Answer:", the next token is the letter: ``_data._benchmarks.choice``), each
method's expected accuracy is the mass its law of that token puts on the correct letter, computed without
sampling.

- The verifier alone: q(correct letter), q the verifier's processed row (the run's temperature, top-k,
  top-p) at the answer position.
- A token rule: pi(correct letter), pi = the exact law the rule emits the answer token from
  (``emitted_distribution`` of ``rule.at_slot(0)`` over the draft's processed row p there): the first
  position of a block, where the draft is judged by the rule, its correction drawn on a rejection; the
  tokens after it do not change the grade.
- Mass on any other token (another letter, a space, "The") counts as wrong, as in lm-evaluation-harness's
  exact match on the generated letter. A letter's tokens are every single token that reads as it, with or
  without a leading space (``letter_token_ids``: `` A`` and ``A``).

One prompt pass per model per problem (``teacher_forced_logits``). Each problem's paired difference
(pi(c) - q(c)) is exact; the interval of the mean difference comes from the problems alone (the paired
bootstrap of ``_math._paired``, the same as the sampled referee's; a difference within ``ROUNDING``, 1e-12,
the float64 rounding of the laws, counts as none, so a lossless rule's is exactly 0). Beside each method the
drift it spends at the answer token, KL(pi || q) and TV(pi, q). Records (one per problem and method) go through a
``RecordLog`` (``KIND``); ``summarize_exact`` recomputes the table from them alone. Block and multi-draft
rules are refused: their first token's law is not a per-token law.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

import numpy as np

from .._analysis._answer_rows import ANSWER_ROWS, answer_rows
from .._analysis._referee_summary import ALONE, EXACT_KIND, summarize_exact
from .._analysis._rescore import exact_answer_accuracy
from .._data._benchmarks import get_benchmark
from .._data._benchmarks.choice import LETTERS
from .._math._sampling import SamplingSettings
from .._math._validation import check_int
from .._models._pair import ModelPair
from .._rules._protocol import judgement_of
from .._util._study import Study, run_study

__all__ = ["KIND", "REFEREE_OUTSIDE", "ExactReferee", "exact_choice_referee", "letter_token_ids"]

#: The kind of record the exact referee writes (``RecordLog``).
KIND = EXACT_KIND
#: What a referee holds that decides no record (its ``outside_setting``): the problems, the rules and what is made
#: of them, the threads, the model pair (``prepare()`` names it).
REFEREE_OUTSIDE = {
    "problems": "the units: each record names its problem and its digest",
    "rules": "each record names its method, the rule's whole description",
    "specs": "the methods' decoding specs, made of the setting's fields and the rules",
    "methods": "the rules' names, each record's method",
    "threads": "CPU threads: the same answers on any number",
    **ModelPair.OUTSIDE_SETTING,
}


def letter_token_ids(tokenizer, letters=LETTERS) -> dict:
    """{letter: sorted ids of the single tokens that read as that letter} (with a leading space, as
    lm-evaluation-harness's target `` A`` is tokenized after "Answer:", and without). A letter no single
    token reads as is a ValueError (the exact referee would count its answers wrong)."""
    out = {}
    for letter in letters:
        ids = set()
        for text in (" " + letter, letter):
            enc = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(enc) == 1 and tokenizer.decode(enc).strip() == letter:
                ids.add(int(enc[0]))
        if not ids:
            raise ValueError(f"no single token of this tokenizer reads as the letter {letter!r}")
        out[letter] = sorted(ids)
    return out


class ExactReferee(Study):
    """The exact referee as a study (``run_study``): one unit per problem, the records of the verifier alone and
    of each rule of ``rules`` there (see the module docstring); the verifier alone's carries the problem's
    answer rows (``_quality_trace``), from which any token rule under any chain is scored again without a model.

    ``verifier``, ``draft``: loaded ((model, tokenizer, identity) triples, or a bare draft model), or paths /
    ids with ``load_options`` (``load_model``'s; a Dask worker loads them once). ``settings``: the sampling and
    its chain (default: the paper's, vLLM's chain). ``threads``: CPU threads of the forwards (default: the CPUs
    this process may use; ``model_threads_for``), said in the progress line."""

    kind: ClassVar[str] = KIND
    unit_name: ClassVar[str] = "problem"
    outside_setting: ClassVar[dict] = REFEREE_OUTSIDE
    setting_as: ClassVar[dict] = {"settings": "sampling", "rows": "answer_rows"}
    summary_options: ClassVar[dict] = {"n_boot": 2000, "seed": 0}

    def __init__(
        self, verifier, draft, problems, rules, *, settings=None, threads=None, load_options=None, rows=ANSWER_ROWS
    ):
        from .._models._decode_spec import DecodeSpec

        self.sampling = settings or SamplingSettings()
        if not problems:
            raise ValueError("problems: give at least one problem (load_problems)")
        for bench in sorted({p.benchmark for p in problems}):
            if not get_benchmark(bench).one_token:
                raise ValueError(
                    f"benchmark {bench!r}: the exact referee needs one token to decide the grade (a multiple-choice "
                    "benchmark asked at the answer position: choice, arc_challenge, ...); grade it by sampling instead"
                )
        self.problems = list(problems)
        _distinct_problems(self.problems)
        self.benchmarks = sorted({p.benchmark for p in self.problems})
        base = DecodeSpec(settings=self.sampling)
        self.specs = [base.with_rule(r) for r in rules]
        for spec in self.specs:  # block and multi-draft rules refused up front
            if not judgement_of(spec.rule).per_token:
                raise ValueError(
                    f"{spec.rule.describe()} judges whole blocks or several drafts: the exact referee needs a token "
                    "rule's law"
                )
        self.methods = [ALONE, *(s.label for s in self.specs)]
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"the rules must be distinct; got {self.methods[1:]}")
        self.threads = threads
        self.answer_rows = check_int(rows, "rows", 1, what="logits kept per model and problem")
        self.pair = ModelPair(verifier, draft, load_options)

    def prepare(self) -> dict:
        from .._models._prefix import NextTokenLogits

        (model, draft), tokenizer = self.pair.models(), self.pair.verifier[1]
        needed = sorted({c for p in self.problems for c in p.reference.get("letters", p.reference["answer"])})
        self._letters = letter_token_ids(tokenizer, "".join(needed))
        self._rows = (NextTokenLogits(model), NextTokenLogits(draft))
        return {
            **self.pair.facts(),
            "answer_tokens": dict(self._letters),
        }

    def units(self) -> list:
        return self.problems

    def unit_keys(self, problem) -> list:
        return [(problem.id, method) for method in self.methods]

    def key(self, record) -> tuple:
        return (record["id"], record["method"])

    def check_held(self, records) -> None:
        _same_problems(records, self.problems)

    @contextlib.contextmanager
    def running(self):
        from .._models._hf import model_threads_for

        with model_threads_for(self.pair.models(), self.threads) as (used, line):
            self._used = used
            yield line

    def run_unit(self, problem, held) -> list:
        from .._math._logits import RuleLogits
        from .._math._sampling import processed_probs
        from .._models._hf import encode_chat

        tokenizer, settings = self.pair.verifier[1], self.sampling
        ids = encode_chat(tokenizer, problem.prompt.text, f"problem {problem.id!r}", chat=False)
        q_raw, p_raw = self._rows[0](ids), self._rows[1](ids)
        q = np.asarray(processed_probs(q_raw[None], settings)[0], dtype=np.float64)
        p = np.asarray(processed_probs(p_raw[None], settings)[0], dtype=np.float64)
        answer = problem.reference["answer"]
        correct = self._letters[answer]
        own = problem.reference.get("letters", answer)
        records = []
        for method, spec in zip(self.methods, [None, *self.specs], strict=True):
            if (problem.id, method) in held:
                continue
            rule = None if spec is None else spec.rule
            logits = None
            if rule is not None and rule.needs_logits:
                logits = RuleLogits(target=q_raw, draft=p_raw, temperature=settings.temperature)
            law = exact_answer_accuracy(rule, p, q, correct, logits=logits)
            records.append(
                {
                    "id": problem.id,
                    "problem": problem.digest,
                    "benchmark": problem.benchmark,
                    "method": method,
                    "answer": answer,
                    **law,
                    "q_correct": float(q[correct].sum()),
                    "p_correct": float(p[correct].sum()),
                    "q_letters": float(q[[i for c in own for i in self._letters[c]]].sum()),
                    "prompt_tokens": len(ids),
                    "threads": self.__dict__.get("_used"),
                    # what rescoring needs: the rows' tops and their log-sum-exps, beside the correct ids
                    **({"rows": answer_rows(q_raw, p_raw, correct, self.answer_rows)} if spec is None else {}),
                }
            )
        return records

    def summarize(self, records, *, n_boot=2000, seed=0):
        return summarize_exact(records, n_boot=n_boot, seed=seed)

    def close(self) -> None:
        rows = self.__dict__.pop("_rows", None)
        if rows is not None:
            for row in rows:
                row.close()
        self.__dict__.pop("_prepared_facts", None)  # a run after close() loads again

    @property
    def label(self) -> str:
        return "exact referee"


def _distinct_problems(problems) -> None:
    """Two different problems under one id are refused."""
    by_id = {}
    for p in problems:
        if by_id.setdefault(p.id, p.digest) != p.digest:
            raise ValueError(f"problems: two different problems share the id {p.id!r}")


def _same_problems(records, problems) -> None:
    """A held record whose id names another problem than this run's (another file of the same benchmark) is
    refused."""
    by_id = {p.id: p.digest for p in problems}
    for n, rec in enumerate(records, 1):
        if rec.get("id") in by_id and rec.get("problem") != by_id[rec["id"]]:
            raise ValueError(
                f"the records file holds answers to another problem under the id {rec['id']!r} (record {n}; another "
                "--file?): write to another file"
            )


def exact_choice_referee(
    verifier,
    draft,
    problems,
    rules,
    *,
    settings=None,
    out=None,
    progress=None,
    threads=None,
    client=None,
    load_options=None,
    rows=ANSWER_ROWS,
) -> list:
    """The exact expected accuracy of the verifier alone and of each token rule of ``rules`` on
    ``problems`` (``load_problems`` of a benchmark whose one token decides: ``choice``, ``arc_challenge``, ...),
    without sampling (see the module docstring): one record per problem and method (id, problem digest,
    method, accuracy, the drift at the answer token, and the mass p and q put on the correct letter; the
    verifier alone's with the answer rows). ``ExactReferee`` run by ``run_study``: ``out`` a records file
    (resumed, refused when it holds another setting), ``client`` a Dask client to spread the problems over
    (``verifier`` and ``draft`` then paths, loaded on each worker with ``load_options``); ``rows``: the logits
    kept per model at each answer position (``ANSWER_ROWS``). Returns the records, problems in order, methods in
    order."""
    study = ExactReferee(
        verifier, draft, problems, rules, settings=settings, threads=threads, load_options=load_options, rows=rows
    )
    return run_study(study, out=out, progress=progress, client=client)
