"""The next-token logits after many prompts, one forward per prompt over what it does not share with the
one before (``NextTokenLogits``): the KV cache of their longest common prefix is kept (a benchmark's prompts
often open with the same description line). The exact quality referee's one prompt pass per model."""

from __future__ import annotations

import numpy as np

from ._hf import cached_model, engine_of

__all__ = ["NextTokenLogits"]


class NextTokenLogits:
    """``self(prompt_ids)``: ``model``'s raw logits (V,) float64 for the token after ``prompt_ids``, from one
    forward over the prompt's tokens after the prefix it shares with the previous prompt (on either engine:
    a ``CachedModel`` or a llama.cpp sequence). ``close()`` frees the cache."""

    def __init__(self, model):
        self.model = model
        self.runner = None
        self.ids = []

    def __call__(self, prompt_ids) -> np.ndarray:
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("prompt_ids must hold at least one token")
        common = 0
        for a, b in zip(self.ids, ids, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # at least the last token is fed: its row is the answer's
        if self.runner is None or common == 0:
            self.close()
            self.runner = cached_model(self.model)
            common = 0
        else:
            self.runner.crop(common)
        row = self.runner.feed(ids[common:], want="last")[-1]
        self.ids = ids
        return np.asarray(row.double().cpu().numpy() if hasattr(row, "double") else row, dtype=np.float64)

    def close(self):
        if self.runner is not None and engine_of(self.model) == "llama.cpp":
            self.runner.close()
        self.runner = None
        self.ids = []
