"""The next-token logits after a prompt, from one forward over the whole prompt in a cache emptied first
(``NextTokenLogits``): the exact quality referee's one prompt pass per model.

No prefix is reused between prompts, though a benchmark's prompts often open alike: a row must be a function
of its prompt alone, whatever problem came before it (on another worker, or before a resume), and llama.cpp's
kernels change with the number of tokens a forward takes (a prompt fed in two parts gave logits up to 0.34
apart from the same prompt fed whole, on the Qwen2.5-Coder pair, Q4_K_M)."""

from __future__ import annotations

import numpy as np

from ._hf import cached_model, engine_of

__all__ = ["NextTokenLogits"]


class NextTokenLogits:
    """``self(prompt_ids)``: ``model``'s raw logits (V,) float64 for the token after ``prompt_ids``, from one
    forward over all of them in an emptied cache (on either engine: a ``CachedModel`` or a llama.cpp
    sequence, kept between calls and emptied). ``close()`` frees the cache."""

    def __init__(self, model):
        self.model = model
        self.runner = None

    def __call__(self, prompt_ids) -> np.ndarray:
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("prompt_ids must hold at least one token")
        if self.runner is not None and engine_of(self.model) == "llama.cpp":
            self.runner.crop(0)  # its sequence emptied: as a fresh one
        else:
            self.runner = cached_model(self.model)
        row = self.runner.feed(ids, want="last")[-1]
        return np.asarray(row.double().cpu().numpy() if hasattr(row, "double") else row, dtype=np.float64)

    def close(self):
        if self.runner is not None and engine_of(self.model) == "llama.cpp":
            self.runner.close()
        self.runner = None
