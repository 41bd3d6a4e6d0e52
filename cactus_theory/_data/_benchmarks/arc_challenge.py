"""ARC-Challenge: AI2's 1,172 hard grade-school science questions (Clark et al. 2018, arXiv 1803.05457), asked at
the answer position."""

from __future__ import annotations

from typing import ClassVar

from .choice import GauntletChoice

__all__ = ["ArcChallenge"]


class ArcChallenge(GauntletChoice):
    """AI2's ARC-Challenge test set (Clark et al. 2018, CC BY-SA 4.0): 1,172 grade-school science questions of
    four choices, as MosaicML's llm-foundry keeps it (``{"query": "Question: ...", "choices": [...], "gold":
    index}``), fetched with its checksum by ``experiments/fetch_benchmark.py``."""

    name: ClassVar[str] = "arc_challenge"
    file: ClassVar[str] = "arc_challenge/test.jsonl"
    gauntlet: ClassVar[str] = "scripts/eval/local_data/world_knowledge/arc_challenge.jsonl"
    licence: ClassVar[str] = "AI2 ARC, CC BY-SA 4.0"
    order: ClassVar[int] = 45
    subject: ClassVar[str | None] = "science"
