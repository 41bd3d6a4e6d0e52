"""GSM8K, two extractions, both kept. ``strict``: grade-school-math's (openai/grade-school-math,
``grade_school_math/dataset.py``: ``extract_answer``, the first ``#### (\\-?[0-9\\.\\,]+)``, stripped, commas
removed; ``is_correct``: string equality with the reference's own extraction; no ``####``, no answer).
``flexible``: lm-evaluation-harness's ``gsm8k`` task (``lm_eval/tasks/gsm8k/gsm8k.yaml``, ``flexible-extract``):
the last match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)``, then its ``exact_match`` with ``regexes_to_ignore`` (``,``,
``\\$``, ``(?s).*#### ``, ``\\.$``) and ``ignore_case`` on both sides. The score is ``strict`` where the answer
has a ``####`` number, else ``flexible`` (the fallback: a chat model often ends with ``\\boxed{18}`` or "the answer
is 18" instead); the tables show both beside it. An answer is first cut at "Question:"
(lm-evaluation-harness's ``until``: what a model writes after it is a new question, not its answer)."""

from __future__ import annotations

import re
from typing import ClassVar

from ._registry import PROGRAM_SECONDS, Benchmark, Grade, text_field

__all__ = ["GSM8K", "gsm8k_answer_text", "gsm8k_flexible", "gsm8k_strict"]

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORED = (",", r"\$", r"(?s).*#### ", r"\.$")


class GSM8K(Benchmark):
    """Grade-school math word problems: the final number."""

    name: ClassVar[str] = "gsm8k"
    file: ClassVar[str] = "gsm8k/test.jsonl"
    source: ClassVar[str] = "github.com/openai/grade-school-math, grade_school_math/data/test.jsonl (MIT)"
    order: ClassVar[int] = 10

    def prompt(self, record):
        question = text_field(self.name, record, "question")
        return f"{question}\nSolve the problem step by step and give the final answer after '####'."

    def reference(self, record, where):
        """The reference as each extraction compares it: the repository's ``extract_answer`` of the record's
        answer, and lm-evaluation-harness's normalisation of the whole answer text."""
        text = str(record.get("answer", ""))
        answer = gsm8k_strict(text)
        if answer is None:
            raise ValueError(f"{where}: the reference 'answer' has no '#### number' (not a GSM8K record?)")
        return {"answer": answer, "answer_flexible": _harness_normal(text)}

    def grade(self, reference, completion, *, timeout=PROGRAM_SECONDS, pattern=None):
        answer = gsm8k_answer_text(completion)
        strict, flexible = gsm8k_strict(answer), gsm8k_flexible(answer)
        by_strict = strict is not None and strict == reference["answer"]
        by_flexible = flexible is not None and flexible == reference["answer_flexible"]
        if strict is not None:
            return Grade(by_strict, strict, "strict", by_strict, by_flexible)
        return Grade(by_flexible, flexible, "flexible", by_strict, by_flexible)


def gsm8k_answer_text(completion: str) -> str:
    """The answer a GSM8K completion gives: its text up to "Question:" (lm-evaluation-harness's ``until``),
    the whole text where there is none."""
    return completion.split("Question:", 1)[0]


def gsm8k_strict(completion: str):
    """grade-school-math's ``extract_answer``: the first ``#### number``, commas removed, else None."""
    match = _STRICT.search(completion)
    return match.group(1).strip().replace(",", "") if match else None


def _harness_normal(text: str) -> str:
    """lm-evaluation-harness's ``exact_match`` normalisation in its gsm8k task: ``regexes_to_ignore``
    (",", "\\$", "(?s).*#### ", "\\.$") removed in that order, then lower case."""
    for pattern in _IGNORED:
        text = re.sub(pattern, "", text)
    return text.lower()


def gsm8k_flexible(completion: str):
    """lm-evaluation-harness's ``flexible-extract``: the last match of its pattern (the first non-empty
    group), stripped, then normalised as its ``exact_match`` compares it; None without a match."""
    found = _FLEXIBLE.findall(completion)
    if not found:
        return None
    group = next((g for g in found[-1] if g), "")
    return _harness_normal(group.strip())
