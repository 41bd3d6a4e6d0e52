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
  the letter an answer gives: the last "the answer is (X)" / "answer: X" (the letter in either case), and
  only where the answer says none, a lone capital letter ending a line (a stray letter after "the answer
  is (X)" never overrides it); or the user's own ``pattern``.

Extraction, as the benchmarks' own harnesses do: a code answer's program is the fenced block that defines
the function under test (any fence: ```` ```python ````, ```` ```python3 ````, ```` ```py ````, an
untagged one; a shell block before it is skipped), else its first Python block, else the text itself; its
top-level ``if __name__ == "__main__":`` block is dropped (human-eval's stop sequences end a completion
before one; EvalPlus's sanitiser removes it). A GSM8K answer is cut at "Question:" (lm-evaluation-harness's
``until``: what a model writes after it is a new question, not its answer).

**Model-written code runs only when asked**: HumanEval and MBPP answers are programs, run by
``_util._sandbox`` (isolated by the operating system) only with ``allow_code_execution=True`` or the
environment variable ``CACTUS_ALLOW_CODE_EXECUTION=1`` (as human-eval, lm-evaluation-harness and
bigcode-evaluation-harness each ask for a flag first). A grade is exact given the answer's text.
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass, field

from .._util._files import json_lines
from .._util._sandbox import run_sandboxed
from ._prompts import Prompt, benchmark_file, benchmark_prompt

__all__ = [
    "ANSWER_PATTERN",
    "CODE_BENCHMARKS",
    "CODE_EXECUTION_ENV",
    "GRADED",
    "LONE_LETTER_PATTERN",
    "Grade",
    "Problem",
    "code_execution_allowed",
    "grade",
    "load_problems",
]

#: The graded benchmarks.
GRADED = ("gsm8k", "humaneval", "mbpp", "choice")
#: The benchmarks whose answers are programs (run only when asked: ``code_execution_allowed``).
CODE_BENCHMARKS = ("humaneval", "mbpp")
#: The environment variable that allows running model-written code (as ``--allow-code-execution``).
CODE_EXECUTION_ENV = "CACTUS_ALLOW_CODE_EXECUTION"
#: The letter an answer says it gives: "the answer is (X)", "answer: X", "Answer: **(c)**" (the letter in
#: either case; a lower-case one only in brackets or ending its line, so "the answer is a prime" gives none).
ANSWER_PATTERN = (
    r"(?i:answer)\s*(?:is\s*:?|:)?\s*[*_]*\s*"
    r"(?:\(\s*([A-Ja-j])\s*\)|([A-J])\b|([a-j])(?=[*_]*[ \t]*[.,;:!]?[ \t]*$))"
)
#: Where an answer says no "answer is": a lone capital letter (in brackets or not) ending a line.
LONE_LETTER_PATTERN = r"(?:^|[\s(])\(?([A-J])\)?[.]?[ \t]*$"
#: The default extraction (``choice_letter``): ANSWER_PATTERN's last match, else LONE_LETTER_PATTERN's.
CHOICE_PATTERN = None
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

    @property
    def digest(self) -> str:
        """What the problem is, whatever its place in its file: the first 16 hex digits of the sha256 of its
        benchmark, prompt text and reference (records are keyed by it: another file's problem under the
        same id is never taken for this one)."""
        import hashlib

        body = json.dumps([self.benchmark, self.prompt.text, self.reference], sort_keys=True, ensure_ascii=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


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


#: A fenced block: its tag (the word after the fence) and its text; an unclosed last fence runs to the end.
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.#-]*)[^\n]*\n(.*?)(?:```|\Z)", flags=re.S)
_PYTHON_TAGS = ("", "python", "py", "python3", "py3")


def code_blocks(completion: str) -> list:
    """The fenced code blocks of an answer, in order: (tag in lower case, text)."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(completion)]


def code_block(completion: str, name: str | None = None) -> str | None:
    """The code an answer gives: the first fenced block that defines ``def name(`` (whatever its tag),
    else the first Python (or untagged) block, else None."""
    blocks = code_blocks(completion)
    if name is not None:
        defines = re.compile(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", flags=re.M)
        for _, text in blocks:
            if defines.search(text):
                return text
    return next((text for tag, text in blocks if tag in _PYTHON_TAGS), None)


_MAIN_TEST = re.compile(r"""^if\s+(?:__name__\s*==\s*(['"])__main__\1|(['"])__main__\2\s*==\s*__name__)\s*:""")


def drop_main_block(code: str) -> str:
    """``code`` without its top-level ``if __name__ == "__main__":`` blocks (the lines of each, found by
    parsing; where the code does not parse, from such a line to the next line that is not indented)."""
    lines = code.splitlines(keepends=True)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        tree = None
    drop = set()
    if tree is not None:
        for node in tree.body:
            if isinstance(node, ast.If) and _MAIN_TEST.match(lines[node.lineno - 1].lstrip()) and not node.orelse:
                drop.update(range(node.lineno - 1, node.end_lineno))
    else:
        inside = False
        for i, line in enumerate(lines):
            if _MAIN_TEST.match(line):
                inside = True
            elif inside and line.strip() and not line[:1].isspace():
                inside = False
            if inside:
                drop.add(i)
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def humaneval_program(problem: Problem, completion: str) -> str:
    """The program human-eval's ``check_correctness`` runs: prompt + completion + tests + check(entry point);
    an answer holding the whole function (a code block defining it) follows the prompt (whose imports and
    helpers it may use) and replaces its stub."""
    ref = problem.reference
    name = ref["entry_point"]
    code = code_block(completion, name)
    if code is not None and re.search(rf"def\s+{re.escape(name)}\s*\(", code):
        body = f"{ref['prompt']}\n{code}"  # the prompt's imports and helpers, then the answer's definition
    else:
        body = ref["prompt"] + (code if code is not None else completion)
    return f"{drop_main_block(body)}\n\n{ref['test']}\n\ncheck({name})\n"


def mbpp_program(problem: Problem, completion: str) -> str:
    """The answer's code (the block defining the function the first assert calls), the problem's
    ``test_setup_code``, then its ``test_list`` asserts."""
    ref = problem.reference
    called = re.search(r"assert\s+\(?\s*(?:not\s+)?\(?\s*([A-Za-z_]\w*)\s*\(", ref["test_list"][0])
    code = code_block(completion, called.group(1) if called else None)
    code = completion if code is None else code
    return "\n".join([drop_main_block(code), ref.get("test_setup_code") or "", *ref["test_list"]]) + "\n"


def _last_letter(pattern, completion):
    found = re.findall(pattern, completion, flags=re.M)
    if not found:
        return None
    last = found[-1]
    letter = next((g for g in (last if isinstance(last, tuple) else (last,)) if g), None)
    return letter.upper() if letter else None


def choice_letter(completion: str, pattern=CHOICE_PATTERN):
    """The letter an answer gives, upper-cased: with ``pattern`` None, the last "answer is (X)"
    (``ANSWER_PATTERN``), else the last lone letter ending a line (``LONE_LETTER_PATTERN``); with a
    ``pattern`` of the user's, its last match (its first non-empty group)."""
    if pattern is not None:
        return _last_letter(pattern, completion)
    said = _last_letter(ANSWER_PATTERN, completion)
    return said if said is not None else _last_letter(LONE_LETTER_PATTERN, completion)


def code_execution_allowed(allow=None) -> bool:
    """Whether model-written code may run: ``allow`` where given, else the environment variable
    ``CACTUS_ALLOW_CODE_EXECUTION`` set to 1."""
    return bool(allow) if allow is not None else os.environ.get(CODE_EXECUTION_ENV) == "1"


def require_code_execution(benchmark, allow=None, *, flag="allow_code_execution=True") -> None:
    """Refuse, in one line naming the way to allow it, to grade ``benchmark``'s programs unless allowed."""
    if benchmark in CODE_BENCHMARKS and not code_execution_allowed(allow):
        raise ValueError(
            f"grading {benchmark} runs the code the model writes: allow it with {flag} or "
            f"{CODE_EXECUTION_ENV}=1 (it runs isolated by the operating system; see the quality page)"
        )


def grade(
    problem: Problem, completion: str, *, timeout=PROGRAM_SECONDS, pattern=CHOICE_PATTERN, allow_code_execution=None
) -> Grade:
    """Grade one answer to ``problem`` (see the module docstring for each benchmark's rule). A HumanEval or
    MBPP answer is run only where ``allow_code_execution`` (or ``CACTUS_ALLOW_CODE_EXECUTION=1``) allows it;
    otherwise a ValueError says how to allow it."""
    if not isinstance(completion, str):
        raise ValueError(f"completion must be the answer's text (a string); got {type(completion).__name__}")
    ref = problem.reference
    if problem.benchmark == "gsm8k":
        answer = gsm8k_answer_text(completion)
        strict, flexible = gsm8k_strict(answer), gsm8k_flexible(answer)
        by_strict = strict is not None and strict == ref["answer"]
        by_flexible = flexible is not None and flexible == ref["answer_flexible"]
        if strict is not None:
            return Grade(by_strict, strict, "strict", by_strict, by_flexible)
        return Grade(by_flexible, flexible, "flexible", by_strict, by_flexible)
    if problem.benchmark in CODE_BENCHMARKS:
        require_code_execution(problem.benchmark, allow_code_execution)
        program = (humaneval_program if problem.benchmark == "humaneval" else mbpp_program)(problem, completion)
        result = run_sandboxed(program, timeout=timeout)
        return Grade(result.passed, None, result.status)
    if problem.benchmark == "choice":
        letter = choice_letter(completion, pattern)
        return Grade(letter is not None and letter == ref["answer"], letter, "letter")
    raise ValueError(f"benchmark must be one of {', '.join(GRADED)}; got {problem.benchmark!r}")


def _records(path):
    """(line number, record) of a benchmark file (``json_lines``: gzip by its name, UTF-8; a truncated or
    corrupt gzip file, bytes that are not UTF-8 and a line that is not JSON each raise a ValueError naming
    the file)."""
    return json_lines(path, "one benchmark record per line")


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
            choices = rec.get("choices")
            choices = [] if choices is None else choices
            if not isinstance(choices, list) or not all(isinstance(c, (str, int, float)) for c in choices):
                raise ValueError(
                    f"{where}: 'choices' must be a list of the choices' texts; got {json.dumps(choices)[:60]}"
                )
            if len(choices) > 10:
                raise ValueError(f"{where}: 'choices' has {len(choices)} entries; the letters A-J name at most 10")
            lines = [rec["question"], *(f"({chr(65 + i)}) {c}" for i, c in enumerate(choices))]
            text = "\n".join(lines) + "\nAnswer with the letter of the correct choice: 'The answer is (X)'."
            reference = {"answer": answer}
        prompt = Prompt(id=f"{benchmark}-{index}", task=benchmark, text=text, index=index)
        out.append(Problem(benchmark, prompt, reference))
    if not out:
        raise ValueError(f"{path} holds no {benchmark} problems from record {start}")
    return out
