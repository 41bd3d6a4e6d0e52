"""Multiple choice, asked as lm-evaluation-harness asks MMLU (its ``mmlu`` task's ``doc_to_text``): the question,
the choices lettered ``A.``, ``B.``, ..., then ``Answer:``; no chat template, so the next token is the letter
(`` A``: the harness's target delimiter and the letter). One token decides the grade: the exact referee
(``_studies._exact_choice``) computes each rule's expected accuracy from the law of that token alone.

``choice``: GPQA-style JSON Lines you give (``--file``): a ``question``, ``choices`` (a list of texts, at most
10), an ``answer`` letter. The public sets of one provenance (MosaicML's llm-foundry evaluation gauntlet at one
commit, ``GauntletChoice``; ``experiments/fetch_benchmark.py`` fetches them with their checksums): ARC-Challenge,
ARC-Easy, CommonsenseQA, OpenBookQA, one module each.

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
    "GAUNTLET",
    "LETTERS",
    "LONE_LETTER_PATTERN",
    "GauntletChoice",
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


class GauntletChoice(MultipleChoice):
    """The base of the multiple-choice sets MosaicML's llm-foundry keeps in its evaluation gauntlet, at one commit
    (``GAUNTLET``): ``{"query": ..., "choices": [...], "gold": index}``, where the query is "Question: ..." (ARC),
    a sentence to complete (OpenBookQA), or the question with its choices already lettered and "Answer:" (the
    choices then read "A", "B", ...: CommonsenseQA). Each is asked here as every multiple-choice benchmark is
    (``answer_position_prompt``), so one token decides. A subclass gives its ``name``, ``file`` and ``gauntlet``
    (its path in the gauntlet)."""

    #: Its path in llm-foundry's tree at ``GAUNTLET``.
    gauntlet: ClassVar[str] = ""
    #: Its licence, for the source line.
    licence: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        if cls.__dict__.get("gauntlet"):
            cls.source = (
                f"github.com/mosaicml/llm-foundry @ {GAUNTLET}, {cls.gauntlet} ({cls.licence}): "
                f"python experiments/fetch_benchmark.py --benchmark {cls.__dict__.get('name', '')}"
            )
        super().__init_subclass__(**kwargs)

    def fields(self, record, where):
        query, choices, gold = record.get("query"), record.get("choices"), record.get("gold")
        if not isinstance(query, str) or not isinstance(choices, list) or not is_integer(gold):
            raise ValueError(f"{where}: a {self.name} record needs 'query', 'choices' and 'gold' (an index)")
        if not 0 <= gold < min(len(choices), len(LETTERS)):
            raise ValueError(f"{where}: 'gold' {gold!r} names no choice (there are {len(choices)})")
        question = query.strip()
        if choices == list(LETTERS[: len(choices)]) and "\nChoices:\n" in question:  # lettered in the query
            question, _, listed = question.partition("\nChoices:\n")
            listed = listed.removesuffix("Answer:").strip().split("\n")
            texts = [line[3:] for line in listed if re.match(r"[A-J]\. ", line)]
            if len(texts) != len(choices):
                raise ValueError(f"{where}: the query letters {len(texts)} choices where 'choices' has {len(choices)}")
            choices = texts
        if question.startswith("Question:"):
            question = question[len("Question:") :].strip()
        return question, choices, LETTERS[gold]


#: The commit of llm-foundry whose evaluation gauntlet the multiple-choice sets are taken from.
GAUNTLET = "8c8dd48f72168c5d51e2f7b151595892a8fba43d"


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
