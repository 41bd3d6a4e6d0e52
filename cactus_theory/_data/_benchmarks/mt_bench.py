"""MT-Bench's questions (lm-sys/FastChat): prompts only (judged by a model in its own harness, not here): the
first turn."""

from __future__ import annotations

from typing import ClassVar

from ._registry import Benchmark, first_turn

__all__ = ["MTBench"]


class MTBench(Benchmark):
    """MT-Bench's 80 multi-turn questions: the first turn as the prompt."""

    name: ClassVar[str] = "mt_bench"
    file: ClassVar[str] = "mt_bench/question.jsonl"
    source: ClassVar[str] = "github.com/lm-sys/FastChat, fastchat/llm_judge/data/mt_bench/question.jsonl (Apache-2.0)"
    graded: ClassVar[bool] = False
    order: ClassVar[int] = 60

    def prompt(self, record):
        return first_turn(self.name, record)
