"""OpenBookQA: 500 elementary science questions that need a fact and common knowledge (Mihaylov et al. 2018,
arXiv 1809.02789), asked at the answer position."""

from __future__ import annotations

from typing import ClassVar

from .choice import GauntletChoice

__all__ = ["OpenBookQA"]


class OpenBookQA(GauntletChoice):
    """OpenBookQA's test set (Mihaylov et al. 2018, Apache 2.0): 500 questions of four choices, each a sentence
    to complete, as llm-foundry's gauntlet keeps it (``{"query": "...", "choices": [...], "gold": index}``)."""

    name: ClassVar[str] = "openbook_qa"
    file: ClassVar[str] = "openbook_qa/test.jsonl"
    gauntlet: ClassVar[str] = "scripts/eval/local_data/commonsense_reasoning/openbook_qa.jsonl"
    licence: ClassVar[str] = "OpenBookQA, Apache 2.0"
    order: ClassVar[int] = 48
    subject: ClassVar[str | None] = "science"
