"""A prompt: a user message for the chat template, with where it came from (``Prompt``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["Prompt"]


@dataclass(frozen=True)
class Prompt:
    """A user message for the chat template, with where it came from."""

    id: str
    task: str
    text: str
    index: int
    #: The file it came from when that is not its task (a Spec-Bench question labelled by its
    #: category: task "translation", dataset "spec_bench").
    dataset: str | None = None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def source(self) -> dict:
        """Where it came from, as a trace records it: dataset, index in it, sha256 of the text."""
        return {"dataset": self.dataset or self.task, "index": self.index, "sha256": self.sha256}
