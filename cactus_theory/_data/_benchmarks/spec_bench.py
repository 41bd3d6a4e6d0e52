"""Spec-Bench's questions (hemingkx/Spec-Bench): prompts only, the first turn; each record's category is its
task (translation, summarization, qa, math_reasoning, rag, ...)."""

from __future__ import annotations

from typing import ClassVar

from ._registry import Benchmark, first_turn

__all__ = ["SpecBench"]


class SpecBench(Benchmark):
    """Spec-Bench's questions over its task categories: the first turn as the prompt."""

    name: ClassVar[str] = "spec_bench"
    file: ClassVar[str] = "spec_bench/question.jsonl"
    source: ClassVar[str] = "github.com/hemingkx/Spec-Bench, data/spec_bench/question.jsonl"
    graded: ClassVar[bool] = False
    order: ClassVar[int] = 70

    def prompt(self, record):
        return first_turn(self.name, record)
