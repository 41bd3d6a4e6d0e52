"""Graded benchmarks: the problems of a benchmark file with what grades an answer to each, written from each
benchmark's own reference code.

- GSM8K, two extractions, both kept. ``strict``: grade-school-math's (openai/grade-school-math,
  ``grade_school_math/dataset.py``: ``extract_answer``, the first ``#### (\\-?[0-9\\.\\,]+)``, stripped,
  commas removed; ``is_correct``: string equality with the reference's own extraction; no ``####``, no
  answer). ``flexible``: lm-evaluation-harness's ``gsm8k`` task (``lm_eval/tasks/gsm8k/gsm8k.yaml``,
  ``flexible-extract``): the last match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)``, then its ``exact_match`` with
  ``regexes_to_ignore`` (``,``, ``\\$``, ``(?s).*#### ``, ``\\.$``) and ``ignore_case`` on both sides.
  The score is ``strict`` where the answer has a ``####`` number, else ``flexible`` (the fallback: a chat
  model often ends with ``\\boxed{18}`` or "the answer is 18" instead); the tables show both beside it.
- HumanEval (openai/human-eval, ``human_eval/execution.py``, ``check_correctness``): the program is the
  prompt, the completion, the problem's ``test`` and ``check(entry_point)``; passed when it exits 0
  within the time limit. A chat model answers with a whole function in a code block (the prompt asks
  for it): the prompt, then the code block, whose definition replaces the prompt's stub.
- MBPP (google-research/mbpp, ``mbpp/README.md``: a solution passes the problem's ``test_list``
  asserts, after its ``test_setup_code``): the answer's code block, then the setup, then the asserts.
- Multiple choice (GPQA-style JSON Lines: a ``question``, optional ``choices``, an ``answer`` letter):
  the letter an answer gives, found by a regular expression (``CHOICE_PATTERN`` by default).

Programs run in ``_util._sandbox`` (a time and memory limit, no network, nothing written outside a
temporary directory). A grade is exact given the answer's text.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass, field

from .._util._sandbox import run_sandboxed
from ._prompts import Prompt, benchmark_file, benchmark_prompt

__all__ = ["CHOICE_PATTERN", "GRADED", "Grade", "Problem", "grade", "load_problems"]

#: The graded benchmarks.
GRADED = ("gsm8k", "humaneval", "mbpp", "choice")
#: A letter the answer gives (the last "answer is (X)" / "answer: X" / a lone capital A-J).
CHOICE_PATTERN = r"(?i:answer\s*(?:is|:)?\s*\(?)([A-J])\b|\b([A-J])\)?\s*$"
#: Seconds a program under test may run (human-eval's default is 3; a cold interpreter on a busy
#: machine needs more to start).
PROGRAM_SECONDS = 10.0

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORED = (",", r"\$", r"(?s).*#### ", r"\.$")


@dataclass(frozen=True)
class Problem:
    """One graded problem: its prompt (the chat message), and what grades an answer (``reference``:
    the number, the tests, the letter)."""

    benchmark: str
    prompt: Prompt
    reference: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.prompt.id


@dataclass(frozen=True)
class Grade:
    """An answer's grade: ``correct`` (the score the tables use), what was extracted, and how a program
    ended (HumanEval, MBPP) or which extraction scored (GSM8K: "strict", or "flexible" as the fallback);
    GSM8K also keeps each extraction's own verdict (``strict``, ``flexible``)."""

    correct: bool
    extracted: str | None = None
    detail: str = ""
    strict: bool | None = None
    flexible: bool | None = None


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


def code_block(completion: str) -> str | None:
    """The first fenced code block of an answer (```python ... ``` or ``` ... ```), else None."""
    match = re.search(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)```", completion, flags=re.S)
    return match.group(1) if match else None


def humaneval_program(problem: Problem, completion: str) -> str:
    """The program human-eval's ``check_correctness`` runs: prompt + completion + tests + check(entry point);
    an answer holding the whole function (a code block defining it) follows the prompt (whose imports and
    helpers it may use) and replaces its stub."""
    ref = problem.reference
    code = code_block(completion)
    if code is not None and re.search(rf"def\s+{re.escape(ref['entry_point'])}\s*\(", code):
        body = f"{ref['prompt']}\n{code}"  # the prompt's imports and helpers, then the answer's definition
    else:
        body = ref["prompt"] + (code if code is not None else completion)
    return f"{body}\n\n{ref['test']}\n\ncheck({ref['entry_point']})\n"


def mbpp_program(problem: Problem, completion: str) -> str:
    """The answer's code, the problem's ``test_setup_code``, then its ``test_list`` asserts."""
    ref = problem.reference
    code = code_block(completion)
    code = completion if code is None else code
    return "\n".join([code, ref.get("test_setup_code") or "", *ref["test_list"]]) + "\n"


def choice_letter(completion: str, pattern=CHOICE_PATTERN):
    """The letter an answer gives: the last match of ``pattern`` (its first non-empty group), upper-cased."""
    found = re.findall(pattern, completion, flags=re.M)
    if not found:
        return None
    last = found[-1]
    letter = next((g for g in (last if isinstance(last, tuple) else (last,)) if g), None)
    return letter.upper() if letter else None


def grade(problem: Problem, completion: str, *, timeout=PROGRAM_SECONDS, pattern=CHOICE_PATTERN) -> Grade:
    """Grade one answer to ``problem`` (see the module docstring for each benchmark's rule)."""
    if not isinstance(completion, str):
        raise ValueError(f"completion must be the answer's text (a string); got {type(completion).__name__}")
    ref = problem.reference
    if problem.benchmark == "gsm8k":
        strict, flexible = gsm8k_strict(completion), gsm8k_flexible(completion)
        by_strict = strict is not None and strict == ref["answer"]
        by_flexible = flexible is not None and flexible == ref["answer_flexible"]
        if strict is not None:
            return Grade(by_strict, strict, "strict", by_strict, by_flexible)
        return Grade(by_flexible, flexible, "flexible", by_strict, by_flexible)
    if problem.benchmark in ("humaneval", "mbpp"):
        program = (humaneval_program if problem.benchmark == "humaneval" else mbpp_program)(problem, completion)
        result = run_sandboxed(program, timeout=timeout)
        return Grade(result.passed, None, result.status)
    if problem.benchmark == "choice":
        letter = choice_letter(completion, pattern)
        return Grade(letter is not None and letter == ref["answer"], letter, "letter")
    raise ValueError(f"benchmark must be one of {', '.join(GRADED)}; got {problem.benchmark!r}")


def _records(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}, line {n}: not JSON ({exc.msg})") from None


def _gsm8k_answer(rec, where):
    """The reference as each extraction compares it: the repository's ``extract_answer`` of the record's
    answer, and lm-evaluation-harness's normalisation of the whole answer text."""
    text = str(rec.get("answer", ""))
    answer = gsm8k_strict(text)
    if answer is None:
        raise ValueError(f"{where}: the reference 'answer' has no '#### number' (not a GSM8K record?)")
    return {"answer": answer, "answer_flexible": _harness_normal(text)}


def load_problems(benchmark, data=None, *, path=None, limit=None, start=0) -> list:
    """The problems of ``benchmark`` (``GRADED``): from its file in the data directory ``data``
    (``benchmark_file``), or from ``path`` (any file of that benchmark's records; for "choice", a JSON
    Lines file of ``{"question": ..., "choices": [...], "answer": "B"}``), records ``start`` to
    ``start + limit``. Ids as the prompt loaders make them (``gsm8k-0``, ...)."""
    if benchmark not in GRADED:
        raise ValueError(f"benchmark must be one of {', '.join(GRADED)}; got {benchmark!r}")
    if path is None:
        if benchmark == "choice":
            raise ValueError(
                "benchmark 'choice' reads the file you give (path=...): JSON Lines with 'question', "
                "'choices' and 'answer' (a letter)"
            )
        path = benchmark_file(benchmark, data)
    path = str(path)
    if not os.path.isfile(path):
        raise ValueError(f"benchmark file {path!r} does not exist")
    out = []
    for n, rec in _records(path):
        index = n - 1
        if index < start:
            continue
        if limit is not None and len(out) >= limit:
            break
        where = f"{path}, line {n}"
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: a record is a JSON object")
        if benchmark == "gsm8k":
            reference = _gsm8k_answer(rec, where)
            text = benchmark_prompt("gsm8k", rec)
        elif benchmark == "humaneval":
            missing = [k for k in ("prompt", "test", "entry_point") if not isinstance(rec.get(k), str)]
            if missing:
                raise ValueError(f"{where}: a HumanEval record needs {missing}")
            reference = {k: rec[k] for k in ("prompt", "test", "entry_point")}
            text = benchmark_prompt("humaneval", rec)
        elif benchmark == "mbpp":
            tests = rec.get("test_list")
            if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
                raise ValueError(f"{where}: an MBPP record needs 'test_list', a list of assert statements")
            reference = {"test_list": tests, "test_setup_code": str(rec.get("test_setup_code") or "")}
            text = benchmark_prompt("mbpp", rec)
        else:
            answer = str(rec.get("answer", "")).strip().upper()
            if not re.fullmatch(r"[A-J]", answer) or not isinstance(rec.get("question"), str):
                raise ValueError(f"{where}: a multiple-choice record needs 'question' and 'answer' (a letter A-J)")
            choices = rec.get("choices") or []
            lines = [rec["question"], *(f"({chr(65 + i)}) {c}" for i, c in enumerate(choices))]
            text = "\n".join(lines) + "\nAnswer with the letter of the correct choice: 'The answer is (X)'."
            reference = {"answer": answer}
        prompt = Prompt(id=f"{benchmark}-{index}", task=benchmark, text=text, index=index)
        out.append(Problem(benchmark, prompt, reference))
    if not out:
        raise ValueError(f"{path} holds no {benchmark} problems from record {start}")
    return out
