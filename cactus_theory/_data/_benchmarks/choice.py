"""Multiple choice (GPQA-style JSON Lines: a ``question``, optional ``choices``, an ``answer`` letter): the letter
an answer gives: the last "the answer is (X)" / "answer: X" (the letter in either case), and only where the
answer says none, a lone capital letter ending a line (a stray letter after "the answer is (X)" never
overrides it); or the user's own ``pattern``. ``MultipleChoice`` is also the base of a registered
multiple-choice benchmark with a file of its own."""

from __future__ import annotations

import json
import re
from typing import ClassVar

from ._registry import PROGRAM_SECONDS, Benchmark, Grade

__all__ = ["ANSWER_PATTERN", "CHOICE_PATTERN", "LONE_LETTER_PATTERN", "MultipleChoice", "choice_letter"]

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


class MultipleChoice(Benchmark):
    """A file of multiple-choice questions you give (``--file``): ``question``, ``choices`` (a list of
    texts, at most 10), ``answer`` (a letter A-J)."""

    name: ClassVar[str] = "choice"
    order: ClassVar[int] = 40

    def prompt(self, record):
        choices = record.get("choices")
        choices = [] if choices is None else choices
        lines = [str(record.get("question", "")), *(f"({chr(65 + i)}) {c}" for i, c in enumerate(choices))]
        return "\n".join(lines) + "\nAnswer with the letter of the correct choice: 'The answer is (X)'."

    def reference(self, record, where):
        answer = str(record.get("answer", "")).strip().upper()
        if not re.fullmatch(r"[A-J]", answer) or not isinstance(record.get("question"), str):
            raise ValueError(f"{where}: a multiple-choice record needs 'question' and 'answer' (a letter A-J)")
        choices = record.get("choices")
        choices = [] if choices is None else choices
        if not isinstance(choices, list) or not all(isinstance(c, (str, int, float)) for c in choices):
            shown = json.dumps(choices)[:60]
            raise ValueError(f"{where}: 'choices' must be a list of the choices' texts; got {shown}")
        if len(choices) > 10:
            raise ValueError(f"{where}: 'choices' has {len(choices)} entries; the letters A-J name at most 10")
        return {"answer": answer}

    def grade(self, reference, completion, *, timeout=PROGRAM_SECONDS, pattern=None):
        letter = choice_letter(completion, pattern)
        return Grade(letter is not None and letter == reference["answer"], letter, "letter")


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
