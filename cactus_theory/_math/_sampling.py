"""Sampling settings (temperature, top-k, top-p) applied to logits before any acceptance rule.

As in vLLM and the paper, both the draft's and the verifier's distributions are processed the
same way before the rule sees them; a token outside the verifier's truncated support has
q(n) = 0. One implementation for NumPy arrays and torch tensors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ._backend import namespace
from ._validation import check_int

__all__ = ["SamplingSettings", "processed_probs"]


@dataclass(frozen=True)
class SamplingSettings:
    """temperature (0 = greedy), top_k (0 = off), top_p (1 = off). Paper defaults: 0.6, 20, 0.95."""

    temperature: float = 0.6
    top_k: int = 20
    top_p: float = 0.95

    def __post_init__(self):
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"{name} must be a number; got {_short(value)}")
        if not (np.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy); got {self.temperature!r}")
        check_int(self.top_k, "top_k", 0, what="0 = no top-k")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must lie in (0, 1] (1 = no top-p); got {self.top_p!r}")

    @classmethod
    def from_dict(cls, value, where: str = "sampling") -> SamplingSettings:
        """Settings from a stored dict (a manifest's ``metadata.sampling``): unknown keys and values
        of the wrong type raise a ValueError naming ``where`` and the field. None or {} gives the
        defaults."""
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object with temperature, top_k, top_p; got {_short(value)}")
        unknown = sorted(set(value) - {"temperature", "top_k", "top_p"})
        if unknown:
            raise ValueError(f"{where} has unknown field(s) {unknown}; its fields are temperature, top_k, top_p")
        try:
            return cls(**value)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict:
        return asdict(self)


def _short(value, limit=60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def processed_probs(logits, settings: SamplingSettings | None = None, **kwargs):
    """Probabilities after temperature, then top-k, then top-p (vLLM order), over the last axis.

    - temperature 0: one-hot on the argmax (greedy);
    - top-k keeps every logit >= the k-th largest, so ties with the k-th are all kept and more
      than k tokens may remain (vLLM's ``apply_top_k_top_p``);
    - top-p keeps the smallest prefix of the sorted distribution whose mass reaches top_p
      (a token is kept if the mass before it is < top_p).

    Exact given the logits. -inf logits (masked tokens) are allowed; +inf logits take all the
    mass, shared equally (the limit of the softmax); any temperature > 0 works (a tiny one tends
    to greedy without overflow). NaN logits, and a row with every token at -inf, raise a
    ValueError. Works on NumPy and torch (float16 / bfloat16 computed in float32, result in
    float32).

    Examples
    --------
    >>> import numpy as np
    >>> processed_probs(np.log([0.5, 0.3, 0.2]), temperature=1.0, top_k=2, top_p=1.0)
    array([0.625, 0.375, 0.   ])
    """
    s = settings if settings is not None else SamplingSettings(**kwargs)
    if settings is not None and kwargs:
        raise ValueError("give either settings or keyword settings, not both")
    b = namespace(logits)
    x = b.promote(b.asarray(logits))
    if b.shape(x)[-1] == 0:
        raise ValueError("logits have an empty vocabulary axis")
    if b.any(b.isnan(x)):
        raise ValueError("logits contain NaN: check the model's output (overflow in float16?)")
    if b.any(b.max_last(x) == -np.inf):
        bad = np.argwhere(b.to_numpy(b.max_last(x)) == -np.inf)[0]
        raise ValueError(
            f"logits row {tuple(int(i) for i in bad)} is -inf everywhere (every token masked): there is no "
            "distribution to sample; check the logits processors"
        )
    zeros = b.mask_to(x != x, x)
    top_is_inf = b.max_last(x, keepdims=True) == np.inf
    if b.any(top_is_inf):  # the +inf entries share the mass
        x = b.where(top_is_inf, b.where(x == np.inf, zeros, zeros - np.inf), x)
    vocab = b.shape(x)[-1]
    if s.greedy:
        return b.put_last(zeros, b.argmax_last(x), 1.0)
    if 0 < s.top_k and s.top_k * _FEW < vocab:
        out = _top_k_rows(b, x, s, vocab, zeros)
        if out is not None:
            return out
    values, idx = b.sort_desc_last(x)
    return b.scatter_last(_sorted_probs(b, values, s, vocab), idx)


#: top-k below a vocabulary of this many times k takes the candidates-only path.
_FEW = 16


def _sorted_probs(b, values, s, vocab):
    """The processed probabilities of logits ``values`` sorted in decreasing order (last axis):
    top-k (ties with the k-th kept), temperature, top-p."""
    keep = b.mask_to(values > -np.inf, values)
    if 0 < s.top_k < vocab:
        keep = keep * b.mask_to(values >= values[..., s.top_k - 1 : s.top_k], values)
    # (z - max z) / T <= 0: a tiny temperature sends the others to -inf instead of overflowing
    with np.errstate(over="ignore"):
        scaled = (values - values[..., :1]) / s.temperature
    weights = b.exp(b.where(keep > 0, scaled, -np.inf)) * keep
    probs_sorted = weights / b.sum_last(weights, keepdims=True)
    if s.top_p < 1:
        before = b.cumsum_last(probs_sorted) - probs_sorted
        keep = keep * b.mask_to(before < s.top_p, values)
        weights = weights * keep
        probs_sorted = weights / b.sum_last(weights, keepdims=True)
    return probs_sorted


def _top_k_rows(b, x, s, vocab, zeros):
    """``processed_probs`` under top-k without sorting the vocabulary: per row, the tokens at or
    above the k-th largest logit (ties kept) in index order, sorted stably (the full sort's
    order), processed by ``_sorted_probs`` and scattered into zeros. The same probabilities as
    the full path up to the rounding of the normalising sum (over the candidates instead of the
    whole row). None where a row keeps too many (fewer than k finite logits)."""
    flat = b.reshape(x, (-1, vocab))
    out = b.reshape(zeros, (-1, vocab))
    kth = b.topk_threshold(flat, s.top_k)
    for r in range(b.shape(flat)[0]):
        row = flat[r]
        chosen = b.flatnonzero(row >= kth[r])
        if b.shape(chosen)[0] * _FEW > vocab:
            return None
        values, order = b.sort_desc_last(row[chosen])
        out[r, chosen[order]] = _sorted_probs(b, values, s, vocab)
    return b.reshape(out, b.shape(x))
