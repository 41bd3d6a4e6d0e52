"""CommonsenseQA: 1,221 questions of everyday knowledge (Talmor et al. 2019, arXiv 1811.00937), asked at the
answer position."""

from __future__ import annotations

from typing import ClassVar

from .choice import GauntletChoice

__all__ = ["CommonsenseQA"]


class CommonsenseQA(GauntletChoice):
    """CommonsenseQA's validation set (Talmor et al. 2019, MIT licence): 1,221 questions, as llm-foundry's
    gauntlet keeps it: four of the five choices, lettered inside the query (``{"query": "Question: ...\\nChoices:
    \\nA. ...\\nAnswer:", "choices": ["A", "B", "C", "D"], "gold": index}``); the choices' texts are read back
    from the query."""

    name: ClassVar[str] = "commonsense_qa"
    file: ClassVar[str] = "commonsense_qa/test.jsonl"
    gauntlet: ClassVar[str] = "scripts/eval/local_data/commonsense_reasoning/commonsense_qa.jsonl"
    licence: ClassVar[str] = "CommonsenseQA, MIT"
    order: ClassVar[int] = 47
