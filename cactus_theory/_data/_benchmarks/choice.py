"""Multiple choice, asked as lm-evaluation-harness asks MMLU (its ``mmlu`` task's ``doc_to_text``): the question,
the choices lettered ``A.``, ``B.``, ..., then ``Answer:``; no chat template, so the next token is the letter
(`` A``: the harness's target delimiter and the letter). One token decides the grade: the exact referee
(``_studies._exact_choice``) computes each rule's expected accuracy from the law of that token alone.

``choice``: GPQA-style JSON Lines you give (``--file``): a ``question``, ``choices`` (a list of texts, at most
10), an ``answer`` letter. ``arc_challenge``: AI2's ARC-Challenge test set (``experiments/fetch_benchmark.py``).

The letter an answer gives (``choice_letter``): the letter it starts with (the answer-position prompt's
grade: a one-token answer `` A``); for a longer answer the last "the answer is (X)" / "answer: X" (the letter
in either case), and only where it says none, a lone capital letter ending a line (a stray letter after "the
answer is (X)" never overrides it); or the user's own ``pattern``."""

from __future__ import annotations

import json
import re
from typing import ClassVar

from ..._math._validation import is_integer
from ._registry import PROGRAM_SECONDS, Benchmark, Grade

__all__ = [
    "ANSWER_PATTERN",
    "CHOICE_PATTERN",
    "LETTERS",
    "LONE_LETTER_PATTERN",
    "ArcChallenge",
    "MultipleChoice",
    "answer_position_prompt",
    "choice_letter",
]

#: The letters that name choices.
LETTERS = "ABCDEFGHIJ"

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


def answer_position_prompt(question: str, choices, subject: str | None = None) -> str:
    """lm-evaluation-harness's MMLU prompt (``doc_to_text``, with its description where there is a subject):
    the question, the choices lettered ``A.`` to ``J.``, then ``Answer:``, after which the next token is the
    letter."""
    head = f"The following are multiple choice questions (with answers) about {subject}.\n\n" if subject else ""
    lines = [question.strip(), *(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))]
    return head + "\n".join(lines) + "\nAnswer:"


class MultipleChoice(Benchmark):
    """A file of multiple-choice questions you give (``--file``): ``question``, ``choices`` (a list of
    texts, at most 10), ``answer`` (a letter A-J), asked at the answer position (see the module
    docstring)."""

    name: ClassVar[str] = "choice"
    order: ClassVar[int] = 40
    chat: ClassVar[bool] = False
    one_token: ClassVar[bool] = True
    #: What the questions are about (the prompt's description line; None: no description).
    subject: ClassVar[str | None] = None

    def fields(self, record: dict, where: str) -> tuple:
        """(question, choices, answer letter) of a record of this benchmark's file."""
        answer = str(record.get("answer", "")).strip().upper()
        if not re.fullmatch(r"[A-J]", answer) or not isinstance(record.get("question"), str):
            raise ValueError(f"{where}: a multiple-choice record needs 'question' and 'answer' (a letter A-J)")
        return record["question"], record.get("choices"), answer

    def _checked(self, record, where="a record"):
        question, choices, answer = self.fields(record, where)
        choices = [] if choices is None else choices
        if not isinstance(choices, list) or not all(isinstance(c, (str, int, float)) for c in choices):
            shown = json.dumps(choices)[:60]
            raise ValueError(f"{where}: 'choices' must be a list of the choices' texts; got {shown}")
        if len(choices) > 10:
            raise ValueError(f"{where}: 'choices' has {len(choices)} entries; the letters A-J name at most 10")
        if choices and LETTERS.index(answer) >= len(choices):
            raise ValueError(f"{where}: the answer {answer} names no choice (there are {len(choices)})")
        return question, [str(c) for c in choices], answer

    def prompt(self, record):
        question, choices, _ = self._checked(record)
        return answer_position_prompt(question, choices, self.subject)

    def reference(self, record, where):
        _, choices, answer = self._checked(record, where)
        return {"answer": answer, "letters": LETTERS[: max(len(choices), LETTERS.index(answer) + 1)]}

    def grade(self, reference, completion, *, timeout=PROGRAM_SECONDS, pattern=None):
        letter = choice_letter(completion, pattern)
        return Grade(letter is not None and letter == reference["answer"], letter, "letter")


class ArcChallenge(MultipleChoice):
    """AI2's ARC-Challenge test set (Clark et al. 2018, CC BY-SA 4.0): 1,172 grade-school science questions
    of 3 to 5 choices, as MosaicML's llm-foundry keeps it (``{"query": "Question: ...", "choices": [...],
    "gold": index}``), fetched with its checksum by ``experiments/fetch_benchmark.py``."""

    name: ClassVar[str] = "arc_challenge"
    file: ClassVar[str] = "arc_challenge/test.jsonl"
    source: ClassVar[str] = (
        "github.com/mosaicml/llm-foundry @ 8c8dd48f72168c5d51e2f7b151595892a8fba43d, "
        "scripts/eval/local_data/world_knowledge/arc_challenge.jsonl (AI2 ARC, CC BY-SA 4.0): "
        "python experiments/fetch_benchmark.py"
    )
    order: ClassVar[int] = 45
    subject: ClassVar[str | None] = "science"

    def fields(self, record, where):
        query, choices, gold = record.get("query"), record.get("choices"), record.get("gold")
        if not isinstance(query, str) or not isinstance(choices, list) or not is_integer(gold):
            raise ValueError(f"{where}: an arc_challenge record needs 'query', 'choices' and 'gold' (an index)")
        if not 0 <= gold < min(len(choices), len(LETTERS)):
            raise ValueError(f"{where}: 'gold' {gold!r} names no choice (there are {len(choices)})")
        question = query[len("Question:") :].strip() if query.startswith("Question:") else query
        return question, choices, LETTERS[gold]


def _last_letter(pattern, completion):
    found = re.findall(pattern, completion, flags=re.M)
    if not found:
        return None
    last = found[-1]
    letter = next((g for g in (last if isinstance(last, tuple) else (last,)) if g), None)
    return letter.upper() if letter else None


#: An answer that is the letter (`` A``, ``(C)``: the one token at the answer position), or starts with it as
#: a label (``B. Planetary years ...``, ``(D) ...``).
_FIRST_LETTER = re.compile(r"\s*(?:\(?([A-J])\)?\s*$|\(?([A-J])[.)](?:\s|$))")


def choice_letter(completion: str, pattern=CHOICE_PATTERN):
    """The letter an answer gives, upper-cased: with ``pattern`` None, the letter it starts with (`` A``,
    ``B.``, ``(C)``), else the last "answer is (X)" (``ANSWER_PATTERN``), else the last lone letter ending a
    line (``LONE_LETTER_PATTERN``); with a ``pattern`` of the user's, its last match (its first non-empty
    group)."""
    if pattern is not None:
        return _last_letter(pattern, completion)
    first = _FIRST_LETTER.match(completion)
    if first:
        return first.group(1) or first.group(2)
    said = _last_letter(ANSWER_PATTERN, completion)
    return said if said is not None else _last_letter(LONE_LETTER_PATTERN, completion)
