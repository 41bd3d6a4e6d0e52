"""ARC-Easy: AI2's 2,376 easier grade-school science questions (Clark et al. 2018, arXiv 1803.05457), asked at the
answer position."""

from __future__ import annotations

from typing import ClassVar

from .choice import GauntletChoice

__all__ = ["ArcEasy"]


class ArcEasy(GauntletChoice):
    """AI2's ARC-Easy test set (Clark et al. 2018, CC BY-SA 4.0): 2,376 grade-school science questions of four
    choices, as llm-foundry's gauntlet keeps it (the format of ``arc_challenge``)."""

    name: ClassVar[str] = "arc_easy"
    file: ClassVar[str] = "arc_easy/test.jsonl"
    gauntlet: ClassVar[str] = "scripts/eval/local_data/world_knowledge/arc_easy.jsonl"
    licence: ClassVar[str] = "AI2 ARC, CC BY-SA 4.0"
    order: ClassVar[int] = 46
    subject: ClassVar[str | None] = "science"
