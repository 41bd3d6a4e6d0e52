"""Rows processed where the model left them: sampling processing, sampling, top-K and log-sum-exp of
many logit rows at once on any torch device, with no host synchronisation (a failure is a flag the
caller reads with the step's one copy to the host).

- ``row_uniforms``: counter-based random numbers, one stream per sequence: the n-th uniform of
  the splitmix64 generator seeded with the sequence's seed (Steele, Lea & Flood, "Fast splittable
  pseudorandom number generators", OOPSLA 2014), so a sequence draws the same numbers whatever
  rows share its batch, on any device (exact integer arithmetic);
- ``process_rows``: ``processed_probs`` (temperature, top-k with ties kept, top-p: vLLM's order)
  without sorting the vocabulary under top-k and without a host round trip (exact given the
  logits, up to the order of the normalising sums);
- ``sample_rows``: one token per row by inverse transform sampling on float64 cumulative sums (a
  token of probability 0 is never drawn);
- ``compress_rows``: what a trace stores of a raw row (``compress_logits``): the top-K logits and
  ids in a fixed order (value descending, then id ascending) and the float64 log-sum-exp.
"""

from __future__ import annotations

import numpy as np

__all__ = ["compress_rows", "process_rows", "row_uniforms", "sample_rows", "splitmix64"]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _signed(x: int) -> int:
    """A uint64 constant as the int64 with the same bits (torch's integers are signed)."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def splitmix64(seed: int, n: int) -> int:
    """The n-th output (n >= 0) of splitmix64 seeded with ``seed``, in plain Python integers: the
    reference ``row_uniforms`` follows (``tests/models/test_device_rows.py`` checks them equal)."""
    z = (seed + (n + 1) * _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def _shift_right(z, bits: int):
    """Logical right shift of int64 tensors holding uint64 bits (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def row_uniforms(seeds, counters):
    """Uniforms in [0, 1), float64: the ``counters``-th output of splitmix64 seeded with ``seeds``,
    its top 53 bits over 2^53. ``seeds`` (R,) and ``counters`` (R,) or (R, k): int64 tensors on one
    device (seeds are ``prompt_seed`` values, < 2^63). Exact integer arithmetic (int64 wraps modulo
    2^64 on CPU and CUDA alike), so the numbers depend on (seed, counter) alone."""
    import torch

    seeds = seeds.to(torch.int64)
    counters = counters.to(torch.int64)
    if counters.dim() > seeds.dim():
        seeds = seeds.reshape(*seeds.shape, *([1] * (counters.dim() - seeds.dim())))
    z = seeds + (counters + 1) * _signed(_GOLDEN)
    z = (z ^ _shift_right(z, 30)) * _signed(_MIX1)
    z = (z ^ _shift_right(z, 27)) * _signed(_MIX2)
    z = z ^ _shift_right(z, 31)
    return _shift_right(z, 11).to(torch.float64) * 2.0**-53


def sample_rows(probs, uniforms):
    """One token per row of ``probs`` (R, V): the first index whose float64 cumulative sum exceeds
    u times the row's total (inverse transform sampling; a token of probability 0 is never drawn).
    ``uniforms`` (R,) float64 in [0, 1). int64 tensor (R,) on the rows' device."""
    import torch

    cdf = probs.to(torch.float64).cumsum(-1)
    total = cdf[:, -1:]
    target = torch.minimum(uniforms.to(torch.float64)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)


def process_rows(logits, settings):
    """(probabilities (R, V), bad (R,) bool): ``processed_probs(logits, settings)`` row by row, on
    the rows' device with no host synchronisation. ``bad`` flags a row holding NaN or masked
    everywhere (-inf): its probabilities are meaningless and the caller refuses it
    (``processed_probs`` raises for both). Float16 / bfloat16 rows are computed in float32.

    Under top-k (0 < k < V) the vocabulary is not sorted: the tokens above the k-th largest logit
    come from ``torch.topk`` (sorted by value, then id), the tokens tied with the k-th logit keep
    their place in index order (the stable sort's), and top-p's mass before each token is the
    mass above the ties plus its rank among them times their common probability. Without top-k,
    top-p sorts each row (``_sorted_probs``). Another chain than vLLM's (or a min-p) sorts each row and
    applies the chain's steps (``_sorted_probs``). Exact given the logits, up to the order of the
    normalising sums (float32 rounding)."""
    import torch

    from .._math._backend import namespace
    from .._math._sampling import CHAINS, DEFAULT_CHAIN, _sorted_probs

    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    vocab = x.shape[-1]
    top = x.amax(-1, keepdim=True)
    bad = torch.isnan(x).any(-1) | (top[:, 0] == -torch.inf)
    # +inf logits share the mass equally (the limit of the softmax): they become 0, the rest -inf
    x = torch.where(top == torch.inf, torch.where(x == torch.inf, 0.0, -torch.inf), x)
    x = torch.nan_to_num(x, nan=-torch.inf)
    if settings.greedy:
        out = torch.zeros_like(x)
        return out.scatter_(-1, x.argmax(-1, keepdim=True), 1.0), bad
    if settings.steps != CHAINS[DEFAULT_CHAIN] or settings.min_p > 0:  # another chain: the general path, sorted
        b = namespace(x)
        values, idx = b.sort_desc_last(x)
        return b.scatter_last(_sorted_probs(b, values, settings, vocab), idx), bad
    k = settings.top_k if 0 < settings.top_k < vocab else 0
    if not k and settings.top_p >= 1:
        return torch.softmax(x / settings.temperature, -1).nan_to_num_(0.0), bad
    if not k:
        b = namespace(x)
        values, idx = b.sort_desc_last(x)
        return b.scatter_last(_sorted_probs(b, values, settings, vocab), idx), bad
    top_values, top_ids = torch.topk(x, k, dim=-1)
    kth = top_values[:, -1:]
    keep = (x >= kth) & (x > -torch.inf)
    peak = torch.where(top_values[:, :1] > -torch.inf, top_values[:, :1], 0.0)
    weights = torch.where(keep, torch.exp((x - peak) / settings.temperature), 0.0)
    if settings.top_p < 1:
        probs = weights / weights.sum(-1, keepdim=True)
        keep = keep & _top_p_keep(x, probs, top_values, top_ids, kth, settings.top_p)
        weights = torch.where(keep, weights, 0.0)
    return weights / weights.sum(-1, keepdim=True), bad


def _top_p_keep(x, probs, top_values, top_ids, kth, top_p):
    """Which tokens top-p keeps among the top-k set: a token is kept when the mass before it in the
    stable descending order is < top_p. Tokens above the k-th logit are at most k - 1 (ordered by
    value, then id); those tied with it follow, in index order, each with the same probability."""
    import torch

    above = top_values > kth
    # the candidates above the ties in (value descending, id ascending) order
    ids_sorted, by_id = top_ids.sort(-1)
    values_by_id = top_values.gather(-1, by_id)
    _, order = values_by_id.masked_fill(values_by_id <= kth, -torch.inf).sort(dim=-1, descending=True, stable=True)
    cand_ids = ids_sorted.gather(-1, order)
    cand_above = above.gather(-1, by_id).gather(-1, order)
    cand_probs = torch.where(cand_above, probs.gather(-1, cand_ids), 0.0)
    before = cand_probs.cumsum(-1) - cand_probs
    keep = torch.zeros_like(x, dtype=torch.bool)
    keep.scatter_(-1, cand_ids, cand_above & (before < top_p))
    mass_above = cand_probs.sum(-1, keepdim=True)
    tied = x == kth
    rank = tied.to(torch.int64).cumsum(-1) - 1  # place among the ties, in index order
    tie_prob = probs.gather(-1, top_ids[:, -1:])  # every tied token has the k-th's probability
    return keep | (tied & (mass_above + rank.to(probs.dtype) * tie_prob < top_p))


def compress_rows(logits, top_k: int):
    """(top-K logits float32 (R, K), their ids int64 (R, K), log-sum-exp float64 (R,), NaN (R,) bool)
    of raw logit rows (R, V) on their device: ``compress_logits``'s values, the ids in a fixed order
    (value descending, then id ascending: ties do not depend on the kernel). The log-sum-exp is
    max + log(sum exp(x - max)) in float64 (-inf for a row masked everywhere)."""
    import torch

    x = logits.float()
    k = min(int(top_k), x.shape[-1])
    values, ids = torch.topk(x, k, dim=-1)
    ids, by_id = ids.sort(-1)
    values = values.gather(-1, by_id)
    values, order = values.sort(dim=-1, descending=True, stable=True)
    ids = ids.gather(-1, order)
    peak = values[:, :1].to(torch.float64)
    peak = torch.where(torch.isfinite(peak), peak, 0.0)
    lse = peak[:, 0] + torch.log(torch.exp(x.to(torch.float64) - peak).sum(-1))
    return values, ids, lse, torch.isnan(x).any(-1)


def as_host_rows(values, ids, lse):
    """A step's compressed rows on the host as the trace writer stores them: float32, int32, float64."""
    return (np.asarray(values, dtype=np.float32), np.asarray(ids, dtype=np.int32), np.asarray(lse, dtype=np.float64))
