"""This package's own decoders as an engine of the oracle (``DecoderEngine``)."""

from __future__ import annotations

import numpy as np

from ._engine import Engine

__all__ = ["DecoderEngine"]


class DecoderEngine(Engine):
    """This package's own decoders as an engine: the decoder ``decoder_for`` picks for ``spec`` (a ``DecodeSpec``
    with the rule, m, the sampling and the batch: HostChain, HostBatch or OnDevice) on ``verifier`` and ``draft``
    (loaded, or paths with ``load_options``), its rows the models' processed rows over the whole vocabulary and
    their raw logits, its samples ``spec.batch`` prompts of the same context at a time, each with its seed. A draft
    decides every position, the first in the first block; the counters are the first drafted position's."""

    first_drafted = 0
    drafted = "every generated position: the first token is the first block's first draft"

    def __init__(self, verifier, draft, spec, *, path="auto", load_options=None):
        from .._models._pair import ModelPair

        if spec.rule is None:
            raise ValueError("spec: give the rule the decoders run (DecodeSpec(rule=...))")
        if path not in ("auto", "chain", "batch"):
            raise ValueError(
                f"path must be 'auto' (decoder_for's choice), 'chain' (the host loop, one sequence) or 'batch' (the "
                f"host loop, a batch); got {path!r}"
            )
        self.spec, self.m, self.path = spec, spec.m, path
        self.pair = ModelPair(verifier, draft, load_options)

    def _decoder(self, spec):
        from .._models._decoding import batched_decoder, chain_decoder, decoder_for

        model, draft = self.pair.models()
        if self.path == "batch":  # the host loop, however ready the device loop is
            return batched_decoder(spec, model, draft, device=False)
        return {"auto": decoder_for, "chain": chain_decoder}[self.path](spec, model, draft)

    def setting(self) -> dict:
        return {
            "engine": "cactus_theory",
            "decoder": type(self._decoder(self.spec)).__name__,
            **self.pair.facts(),
            "sampling": self.spec.settings.as_dict(),
            "m": self.spec.m,
            "batch": self.spec.batch,
        }

    def _raw(self, prefix):
        from .._models._prefix import NextTokenLogits

        key = tuple(int(t) for t in prefix)
        cache = self.__dict__.setdefault("_cache", {})
        if key not in cache:
            if "_next" not in self.__dict__:
                self._next = [NextTokenLogits(m) for m in self.pair.models()]
            cache[key] = (self._next[0](list(key)), self._next[1](list(key)))
        return cache[key]

    def rows(self, prefix):
        from .._math._sampling import processed_probs

        q_raw, p_raw = self._raw(prefix)
        q = processed_probs(q_raw[None], self.spec.settings)[0]
        p = processed_probs(p_raw[None], self.spec.settings)[0]
        return dict(enumerate(q.tolist())), dict(enumerate(p.tolist()))

    def logits(self, prefix):
        from .._math._logits import RuleLogits

        q_raw, p_raw = self._raw(prefix)
        return np.arange(q_raw.size), RuleLogits(target=q_raw, draft=p_raw, temperature=self.spec.settings.temperature)

    def sample(self, context, tokens, seed):
        return self.sample_many(context, tokens, [seed])[0]

    def sample_many(self, context, tokens, seeds):
        import dataclasses

        spec = dataclasses.replace(self.spec, max_new_tokens=int(tokens))
        decoder = self._decoder(spec)
        out = []
        for start in range(0, len(seeds), spec.batch):
            group = list(seeds[start : start + spec.batch])
            for result in decoder.generate([list(context)] * len(group), group, ()):
                first = 1 if result.accepted and result.accepted[0] >= 1 else 0
                out.append(([int(t) for t in result.tokens[:tokens]], {"drafted": 1, "accepted": first}))
        return out
