"""Sampling settings and the sampler chain that applies them to logits before any acceptance rule.

Every engine processes a model's raw logits through a chain of steps before it draws a token, and engines
order the steps differently (``CHAINS``):

- ``"vllm"`` (the default): temperature, then min-p, then top-k (ties with the k-th kept), then top-p on the
  tempered law renormalised over what top-k kept (vLLM v1's ``Sampler``: temperature, the argmax-invariant
  processors, ``apply_top_k_top_p``);
- ``"hf"``: temperature, top-k, top-p, min-p (transformers' ``TemperatureLogitsWarper``,
  ``TopKLogitsWarper``, ``TopPLogitsWarper``, ``MinPLogitsWarper``, in the order ``generate`` builds them);
- ``"sglang"``: temperature, top-k, top-p, min-p, each renormalising (SGLang's flashinfer path:
  ``top_k_renorm_prob``, ``top_p_renorm_prob``, ``min_p_sampling_from_probs``);
- ``"llama.cpp"``: top-k keeping exactly k (``llama_sampler_top_k``), top-p on the *untempered* law
  renormalised over those k, min-p on the untempered logits (0.05 by default in llama.cpp's tools; 0 here
  unless given), temperature last (llama.cpp's default sampler order in ``common/sampling.cpp``: penalties,
  DRY, top-n-sigma, top-k, typical-p, top-p, min-p, XTC, temperature; the ones not named here are off by
  default);
- or a user's tuple of steps in order (``STEPS``; each once, ``"temperature"`` among them).

As in vLLM and the paper, both the draft's and the verifier's distributions are processed the same way before
the rule sees them; a token outside the verifier's truncated support has q(n) = 0. One implementation for
NumPy arrays and torch tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._backend import namespace
from ._validation import check_int

__all__ = ["CHAINS", "DEFAULT_CHAIN", "STEPS", "SamplingSettings", "processed_probs"]

#: The steps a sampler chain is made of: ``temperature`` (logits / T), ``top_k`` (every token at or above the
#: k-th largest logit: ties kept), ``top_k_exact`` (exactly the k largest: ties broken by the lower token id),
#: ``top_p`` (the smallest prefix, in decreasing order, whose mass under the law at that point of the chain
#: reaches top_p: a token is kept when the mass before it is < top_p), ``min_p`` (tokens whose probability at
#: that point of the chain is at least min_p times the largest).
STEPS = ("temperature", "top_k", "top_k_exact", "top_p", "min_p")
#: Each engine's chain (see the module docstring).
CHAINS = {
    "vllm": ("temperature", "min_p", "top_k", "top_p"),
    "hf": ("temperature", "top_k", "top_p", "min_p"),
    "sglang": ("temperature", "top_k", "top_p", "min_p"),
    "llama.cpp": ("top_k_exact", "top_p", "min_p", "temperature"),
}
#: The chain of a ``SamplingSettings`` that names none (the one every result before chains were named used).
DEFAULT_CHAIN = "vllm"
_FIELDS = ("temperature", "top_k", "top_p", "min_p", "chain")


def _chain_steps(chain) -> tuple:
    """The steps of ``chain`` (a name of ``CHAINS`` or a sequence of ``STEPS``), checked."""
    if isinstance(chain, str):
        if chain not in CHAINS:
            raise ValueError(
                f"chain must be one of {', '.join(CHAINS)} or a list of steps ({', '.join(STEPS)}); got {chain!r}"
            )
        return CHAINS[chain]
    if not isinstance(chain, (list, tuple)) or not all(isinstance(s, str) for s in chain):
        raise ValueError(f"chain must be a name ({', '.join(CHAINS)}) or a list of step names; got {_short(chain)}")
    unknown = [s for s in chain if s not in STEPS]
    if unknown:
        raise ValueError(f"chain: unknown step(s) {unknown}; the steps are {', '.join(STEPS)}")
    if len(set(chain)) != len(chain) or ("top_k" in chain and "top_k_exact" in chain):
        raise ValueError(f"chain: each step at most once (and one top-k); got {list(chain)}")
    if "temperature" not in chain:
        raise ValueError(f"chain: a chain applies the temperature somewhere; got {list(chain)}")
    return tuple(chain)


@dataclass(frozen=True)
class SamplingSettings:
    """temperature (0 = greedy), top_k (0 = off), top_p (1 = off), min_p (0 = off) and the ``chain`` that
    applies them (a name of ``CHAINS``, default ``"vllm"``, or a tuple of ``STEPS``). Paper defaults: 0.6, 20,
    0.95, no min-p, vLLM's chain.

    Examples
    --------
    >>> SamplingSettings(chain="llama.cpp", min_p=0.05).steps
    ('top_k_exact', 'top_p', 'min_p', 'temperature')
    >>> SamplingSettings().as_dict()
    {'temperature': 0.6, 'top_k': 20, 'top_p': 0.95}
    """

    temperature: float = 0.6
    top_k: int = 20
    top_p: float = 0.95
    min_p: float = 0.0
    chain: str | tuple = DEFAULT_CHAIN

    def __post_init__(self):
        for name in ("temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"{name} must be a number; got {_short(value)}")
        if not (np.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy); got {self.temperature!r}")
        check_int(self.top_k, "top_k", 0, what="0 = no top-k")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must lie in (0, 1] (1 = no top-p); got {self.top_p!r}")
        if not (0 <= self.min_p < 1):
            raise ValueError(f"min_p must lie in [0, 1) (0 = no min-p); got {self.min_p!r}")
        steps = _chain_steps(self.chain)
        if not isinstance(self.chain, str):
            object.__setattr__(self, "chain", steps)
            off = {"top_k": self.top_k == 0, "top_p": self.top_p == 1, "min_p": self.min_p == 0}
            missing = [
                name
                for name, is_off in off.items()
                if not is_off and name not in steps and not (name == "top_k" and "top_k_exact" in steps)
            ]
            if missing:
                raise ValueError(f"chain {list(steps)} has no step for {', '.join(missing)}: add it, or turn it off")

    @classmethod
    def from_dict(cls, value, where: str = "sampling") -> SamplingSettings:
        """Settings from a stored dict (a manifest's ``metadata.sampling``, a record's setting): unknown keys
        and values of the wrong type raise a ValueError naming ``where`` and the field. None or {} gives the
        defaults."""
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object with {', '.join(_FIELDS)}; got {_short(value)}")
        unknown = sorted(set(value) - set(_FIELDS))
        if unknown:
            raise ValueError(f"{where} has unknown field(s) {unknown}; its fields are {', '.join(_FIELDS)}")
        try:
            fields = dict(value)
            if isinstance(fields.get("chain"), list):
                fields["chain"] = tuple(fields["chain"])
            return cls(**fields)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def steps(self) -> tuple:
        """The chain's steps in order."""
        return _chain_steps(self.chain)

    @property
    def chain_name(self) -> str:
        """The chain's name (``CHAINS``), or its steps joined by " > " for a user's chain."""
        return self.chain if isinstance(self.chain, str) else " > ".join(self.chain)

    def describe(self) -> str:
        """One line for a page or a table: the settings and the chain that applies them."""
        parts = [f"temperature {self.temperature:g}", f"top-k {self.top_k}", f"top-p {self.top_p:g}"]
        if self.min_p:
            parts.append(f"min-p {self.min_p:g}")
        return ", ".join(parts) + f"; chain {self.chain_name} ({' > '.join(self.steps)})"

    def support_within(self, k: int) -> bool:
        """Whether every processed distribution is supported on the ``k`` largest logits of its row, whatever
        the rest of the row holds: greedy, or a top-k of at most ``k`` applied before any top-p (the other
        steps only remove tokens, and min-p compares with the largest, which top-k keeps). A row's top ``k``
        logits then decide its processed law exactly."""
        if self.greedy:
            return True
        if not 0 < self.top_k <= k:
            return False
        steps = self.steps
        top_k = steps.index("top_k_exact" if "top_k_exact" in steps else "top_k")
        return self.top_p >= 1 or top_k < steps.index("top_p")

    def as_dict(self) -> dict:
        """The settings as records and manifests keep them: min-p and the chain only where they are not the
        defaults (so what was written before chains were named reads as the same settings)."""
        out = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        if self.min_p:
            out["min_p"] = self.min_p
        if self.chain != DEFAULT_CHAIN:
            out["chain"] = self.chain if isinstance(self.chain, str) else list(self.chain)
        return out


def _short(value, limit=60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def processed_probs(logits, settings: SamplingSettings | None = None, **kwargs):
    """Probabilities after the settings' sampler chain (``SamplingSettings.chain``; default vLLM's:
    temperature, min-p, top-k, top-p), over the last axis.

    - temperature 0: one-hot on the argmax (greedy), whatever the chain;
    - ``top_k`` keeps every logit >= the k-th largest, so ties with the k-th are all kept and more than k
      tokens may remain (vLLM's ``apply_top_k_top_p``, transformers' ``TopKLogitsWarper``); ``top_k_exact``
      (llama.cpp's) keeps exactly k, ties broken by the lower token id (llama.cpp leaves their order to its
      sort);
    - top-p keeps the smallest prefix of the sorted law at that point of the chain (tempered or not,
      renormalised over what the steps before it kept) whose mass reaches top_p (a token is kept if the mass
      before it is < top_p);
    - min-p keeps the tokens whose probability at that point is at least min_p times the largest.

    Exact given the logits (computed in float64 for float64 input; llama.cpp computes its chain in float32, so
    the two can differ where a token sits on a boundary within float32 rounding). -inf logits (masked tokens)
    are allowed; +inf logits take all the mass, shared equally (the limit of the softmax); any temperature > 0
    works (a tiny one tends to greedy without overflow). NaN logits, and a row with every token at -inf, raise
    a ValueError. Works on NumPy and torch (float16 / bfloat16 computed in float32, result in float32).

    Examples
    --------
    >>> import numpy as np
    >>> processed_probs(np.log([0.5, 0.3, 0.2]), temperature=1.0, top_k=2, top_p=1.0)
    array([0.625, 0.375, 0.   ])
    >>> logits = np.log([0.5, 0.3, 0.15, 0.05])           # top-p on the untempered law, then temperature 0.5
    >>> processed_probs(logits, temperature=0.5, top_k=3, top_p=0.6, chain="llama.cpp").round(4)
    array([0.7353, 0.2647, 0.    , 0.    ])
    >>> processed_probs(logits, temperature=0.5, top_k=3, top_p=0.6).round(4)   # vLLM's: on the tempered law
    array([1., 0., 0., 0.])
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
    if 0 < s.top_k and s.top_k * _FEW < vocab and s.support_within(s.top_k):
        out = _top_k_rows(b, x, s, vocab, zeros)
        if out is not None:
            return out
    values, idx = b.sort_desc_last(x)
    return b.scatter_last(_sorted_probs(b, values, s, vocab), idx)


#: top-k below a vocabulary of this many times k takes the candidates-only path.
_FEW = 16


def _kept_law(b, values, keep, temperature):
    """softmax(values / temperature) over the kept entries (``keep``: 0.0 / 1.0) of rows sorted in
    decreasing order; 0 elsewhere. (z - max z) / T <= 0: a tiny temperature sends the others to -inf instead
    of overflowing."""
    with np.errstate(over="ignore"):
        scaled = (values - values[..., :1]) / temperature
    weights = b.exp(b.where(keep > 0, scaled, -np.inf)) * keep
    return weights / b.sum_last(weights, keepdims=True)


def _sorted_probs(b, values, s, vocab):
    """The processed probabilities of logits ``values`` sorted in decreasing order (last axis, ties in index
    order): the chain's steps in turn, each on what the steps before it kept, at the scale they left (1
    before the temperature step, 1 / T after it), then the law at temperature T over what is kept."""
    keep = b.mask_to(values > -np.inf, values)
    scale = 1.0
    for step in s.steps:
        if step == "temperature":
            scale = s.temperature
        elif step == "top_k" and 0 < s.top_k < vocab:
            keep = keep * b.mask_to(values >= values[..., s.top_k - 1 : s.top_k], values)
        elif step == "top_k_exact" and 0 < s.top_k < vocab:
            keep = keep * b.mask_to(b.cumsum_last(keep) <= s.top_k, values)
        elif step == "top_p" and s.top_p < 1:
            law = _kept_law(b, values, keep, scale)
            before = b.cumsum_last(law) - law
            keep = keep * b.mask_to(before < s.top_p, values)
        elif step == "min_p" and s.min_p > 0:
            with np.errstate(over="ignore", invalid="ignore"):
                relative = (values - values[..., :1]) / scale
            keep = keep * b.mask_to(relative >= np.log(s.min_p), values)
    return _kept_law(b, values, keep, s.temperature)


def _top_k_rows(b, x, s, vocab, zeros):
    """``processed_probs`` under top-k without sorting the vocabulary: per row, the tokens at or
    above the k-th largest logit (ties kept) in index order, sorted stably (the full sort's
    order), processed by ``_sorted_probs`` and scattered into zeros. The same probabilities as
    the full path up to the rounding of the normalising sum (over the candidates instead of the
    whole row). Only for chains whose top-k comes before their top-p (``support_within``). None where a
    row keeps too many (fewer than k finite logits)."""
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
