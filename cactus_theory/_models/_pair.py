"""The model pair a study runs (``ModelPair``): the verifier and the draft as the caller loaded them, or what
``load_model`` takes (paths or ids, and load options), loaded once in each process that runs the study (a Dask
worker loads the pair the first time a unit needs it, and keeps it for every later unit)."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["ModelPair"]

#: The pairs this process loaded: {(verifier, draft, options): (verifier triple, draft triple)}.
_LOADED: dict = {}


class ModelPair:
    """``verifier``: a (model, tokenizer, identity) triple, or a path / id; ``draft``: a model, its triple, a
    drafter, or a path / id; ``load_options``: ``load_model``'s keywords for the paths (device, dtype, engine,
    context...). A pair given by paths travels to Dask workers (each loads it once); a pair of loaded models
    runs in this process only."""

    #: What a study holding a pair says of it in its ``outside_setting``: its ``prepare()`` names the models'
    #: weights and arithmetic, which is what decides records.
    OUTSIDE_SETTING: ClassVar[dict] = {
        "pair": "the models: prepare() names their weights and arithmetic",
        "verifier": "the pair's (prepare() names it)",
        "draft": "the pair's (prepare() names it)",
        "load_options": "how the pair loads (prepare() names its arithmetic)",
    }

    def __init__(self, verifier, draft, load_options=None):
        by_path = [isinstance(x, str) or hasattr(x, "__fspath__") for x in (verifier, draft)]
        if any(by_path) and not all(by_path):
            raise ValueError("give the verifier and the draft both as paths (with load_options) or both loaded")
        self.paths = (str(verifier), str(draft)) if all(by_path) else None
        self.options = dict(load_options or {})
        if self.paths is None and self.options:
            raise ValueError("load_options apply to a pair given by paths")
        self._loaded = None if self.paths else (verifier, draft)

    def _pair(self):
        if self._loaded is None:
            from .._models._hf import load_model

            key = (*self.paths, tuple(sorted(self.options.items())))
            if key not in _LOADED:
                options = {"progress": False, **self.options}
                _LOADED[key] = tuple(load_model(path, **options) for path in self.paths)
            self._loaded = _LOADED[key]
        return self._loaded

    def models(self) -> tuple:
        """(the verifier model, the draft model) as the decoders take them (the draft out of its triple)."""
        from ._hf import split_model

        return self.verifier[0], split_model(self.draft)[0]

    def facts(self) -> dict:
        """What of the pair decides records (a study's ``prepare()`` returns it): each model's identity (its
        weights) and arithmetic (engine, dtype)."""
        from ._hf import model_arithmetic, split_model

        model, draft = self.models()
        return {
            "models": {"verifier": split_model(tuple(self.verifier))[1], "draft": split_model(self.draft)[1]},
            "arithmetic": {"verifier": model_arithmetic(model), "draft": model_arithmetic(draft)},
        }

    @property
    def verifier(self):
        """The verifier's (model, tokenizer, identity) triple."""
        return self._pair()[0]

    @property
    def draft(self):
        """The draft as given (a model, its triple, or a drafter)."""
        return self._pair()[1]

    def __getstate__(self):
        if self.paths is None:
            raise TypeError(
                "a study of models loaded in this process cannot be sent to a Dask worker: give the verifier and the "
                "draft as paths (and load_options), which each worker loads once"
            )
        return {"paths": self.paths, "options": self.options, "_loaded": None}
