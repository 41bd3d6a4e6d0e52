"""Drafters without a model: prompt lookup (``NgramDrafter``), whose drafts the rule sees as one-hot."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NgramDrafter"]


@dataclass(frozen=True)
class NgramDrafter:
    """Prompt lookup: propose the tokens that followed the latest earlier occurrence of the last
    n-gram (n from ``max_ngram`` down to ``min_ngram``) in the prompt and output so far.
    No draft probabilities: the rule sees a one-hot draft distribution."""

    max_ngram: int = 3
    min_ngram: int = 1

    @property
    def identity(self) -> dict:
        """What a record says of this drafter (``model_identity``'s shape)."""
        return {"name": f"ngram({self.min_ngram}-{self.max_ngram})", "source": "prompt lookup", "files": {}}

    def propose(self, context: list, m: int) -> list:
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) <= n:
                continue
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):
                if context[start : start + n] == tail:
                    follow = context[start + n : start + n + m]
                    if follow:
                        return list(follow)
        return []
