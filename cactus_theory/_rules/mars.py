"""MARS, margin-aware verification (Song et al. 2026, arXiv 2601.15498): where the verifier's first two
logits are close, accept any draft among its top two; elsewhere speculative sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._protocol import Rule

__all__ = ["MARS"]

#: The authors' guard against a division by zero in the ratio of the first two logits.
_EPSILON = 1e-10


@dataclass(frozen=True)
class MARS(Rule):
    """MARS (margin-aware verification), as its authors' code runs it (5SSjw/MARS @ 8909b41,
    ``mars/model/utils.py``, ``evaluate_posterior``, sampling branch).

    At each position the verifier's logits are processed (temperature, top-k, top-p: what its sampler
    keeps), and of the processed logits z' the first two, z'_1 >= z'_2 (ties by the lower id), give the
    ratio r = z'_2 / (z'_1 + 1e-10). Where r > ``theta`` (default 0.9, the code's), the draft n is accepted
    iff it is one of those two tokens, and after a rejection the token is drawn from q itself. Elsewhere
    the draft is accepted with min(1, q(n) / p(n)) and after a rejection drawn from q with only the drafted
    token's mass reduced, q(n) -> max(0, q(n) - p(n)), renormalised (``residual="authors"``, the code's); or
    from the speculative-sampling residual norm((q - p)+) (``residual="sps"``, the paper's description).

    **What the ratio sees.** The processed logits are the raw ones over the temperature, so the temperature
    cancels and r is the ratio of the *raw* logits z_2 / z_1 as the model outputs them (the code's 1e-10
    aside): it is not invariant to a constant added to every logit (the softmax is), so the same law of q
    relaxes at one model's logit offset and not at another's, and a z_1 <= 0 inverts the comparison. This
    rule reads the raw target logits (``RuleLogits(target=...)``) and reproduces that as the code does; a
    second token the sampler excludes has z'_2 = -inf (no relaxation where z'_1 > 0). At temperature 0 the
    code decodes greedily: the draft is accepted iff it is the argmax, as ``strict`` there.

    **Not lossless**: where relaxed, pi = p 1_T + (1 - p(T)) q with T the top two; elsewhere, with the
    authors' residual, pi(x) = p(x) a(x) + q(x) (W - w_x) + w_x (q(x) - p(x))+, w_n = p(n) (1 - a_n) /
    (1 - min(p(n), q(n))), W = sum w_n: SpS's law q only for a greedy (one-hot) draft, the case of the EAGLE
    trees the code was written for. Exact, O(V).
    """

    theta: float = 0.9
    residual: str = "authors"
    name: ClassVar[str] = "mars"
    reference: ClassVar[str] = (
        "Song, Wang, Wang, Lei, Shi, Han, Yang, Chang and Ai, MARS: Unleashing the Power of Speculative Decoding via "
        "Margin-Aware Verification, arXiv 2601.15498 (2026); 5SSjw/MARS @ 8909b41, mars/model/utils.py "
        "(evaluate_posterior)"
    )
    table: ClassVar[dict] = {
        "acceptance": "1{n in top-2 of z} where z_2/z_1 > θ, else min(1, q(n)/p(n))",
        "correction": "q where relaxed, else norm(q with q(n) → (q(n) − p(n))+)",
        "emitted": "p·1_T + (1 − p(T)) q where relaxed; else the authors' residual law",
        "lossless": "no",
    }
    comparison: ClassVar[tuple] = (("", {"theta": 0.9}, "verifier"), ("", {"theta": 0.8}, "verifier"))
    examples: ClassVar[tuple] = ({"theta": 0.5}, {"theta": 0.95, "residual": "sps"}, {"theta": -2.0})
    frontier: ClassVar[tuple] = tuple({"theta": t} for t in (0.99, 0.95, 0.9, 0.85, 0.8, 0.7))
    label_fields: ClassVar[tuple] = ("theta",)

    def __post_init__(self):
        if isinstance(self.theta, bool) or not isinstance(self.theta, (int, float, np.number)):
            raise ValueError(f"mars theta must be a number (the ratio of the first two logits); got {self.theta!r}")
        if not np.isfinite(self.theta):
            raise ValueError(f"mars theta must be finite; got {self.theta!r}")
        if self.residual not in ("authors", "sps"):
            raise ValueError(f"mars residual must be 'authors' or 'sps'; got {self.residual!r}")

    @property
    def needs_logits(self) -> tuple:
        return ("target",)

    def _margin(self, q, lg):
        """Host arrays: (relaxed (...,) bool, the top two (..., V) bool, greedy (bool)) of each row."""
        q = np.asarray(q, dtype=np.float64)
        z = np.asarray(lg.target, dtype=np.float64)
        temperature = 1.0 if lg.temperature is None else float(lg.temperature)
        ids = np.broadcast_to(np.arange(q.shape[-1]), q.shape)
        processed = np.where(q > 0, z / temperature if temperature > 0 else z, -np.inf)
        order = np.lexsort((ids, -processed), axis=-1)[..., :2]
        top = np.zeros(q.shape, dtype=bool)
        np.put_along_axis(top, order, True, axis=-1)
        first = np.take_along_axis(processed, order[..., :1], axis=-1)[..., 0]
        second = np.take_along_axis(processed, order[..., 1:2], axis=-1)[..., 0] if q.shape[-1] > 1 else -np.inf
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = second / (first + _EPSILON)
        relaxed = np.nan_to_num(ratio, nan=-np.inf) > self.theta
        return relaxed & (temperature > 0), top, temperature <= 0

    def _laws(self, p, q, lg):
        """Host float64: (acceptance of every token (..., V), the per-row relaxed flag, the top two)."""
        relaxed, top, greedy = self._margin(q, lg)
        if greedy:  # the code's greedy branch: the argmax, as strict verification (q is one-hot there)
            return q.copy(), relaxed, top
        with np.errstate(divide="ignore", invalid="ignore"):
            standard = np.where(p > 0, np.minimum(1.0, q / np.where(p > 0, p, 1.0)), 1.0)
        return np.where(relaxed[..., None], top.astype(np.float64), standard), relaxed, top

    def _residual(self, p, q, n_mask):
        """The correction after rejecting the tokens of ``n_mask`` (one per row), host float64 (..., V)."""
        if self.residual == "sps":
            out = np.maximum(q - p, 0.0)
        else:  # the authors': only the drafted token's mass reduced, by p(n)
            out = np.where(n_mask, np.maximum(q - p, 0.0), q)
        mass = out.sum(-1, keepdims=True)
        return np.where(mass > 0, out / np.where(mass > 0, mass, 1.0), q)

    def _on_backend(self, b, host, like):
        return host if b.name == "numpy" else b.torch.as_tensor(host, dtype=like.dtype, device=like.device)

    def _acceptance(self, b, p, q, n, lg):
        ph, qh = (np.asarray(b.to_numpy(x), dtype=np.float64) for x in (p, q))
        lgh = _host_logits(b, lg)
        accept, _, _ = self._laws(ph, qh, lgh)
        nn = np.asarray(b.to_numpy(n))
        hit = np.take_along_axis(accept, nn[..., None], axis=-1)[..., 0]
        return self._on_backend(b, hit, q) + 0.0 * b.take_last(q, n)

    def _correction(self, b, p, q, n, lg):
        ph, qh = (np.asarray(b.to_numpy(x), dtype=np.float64) for x in (p, q))
        lgh = _host_logits(b, lg)
        _, relaxed, _ = self._laws(ph, qh, lgh)
        nn = np.asarray(b.to_numpy(n))
        n_mask = np.zeros(qh.shape, dtype=bool)
        np.put_along_axis(n_mask, nn[..., None], True, axis=-1)
        greedy = self._margin(qh, lgh)[2]
        out = qh if greedy else np.where(relaxed[..., None], qh, self._residual(ph, qh, n_mask))
        return self._on_backend(b, out, q)

    def _acceptance_all(self, p, q, lg):
        return self._laws(p, q, lg)[0]

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """pi = p 1_T + (1 - p(T)) q where relaxed; elsewhere p a + sum_n p(n) (1 - a_n) r_n in O(V) (see the
        class docstring). Exact."""
        p, q, lg = self._host(draft_probs, target_probs, logits)
        accept, relaxed, _ = self._laws(p, q, lg)
        if self._margin(q, lg)[2]:
            return q.copy()
        kept = p * accept
        rejected = p * (1.0 - accept)
        relaxed_law = kept + rejected.sum(-1, keepdims=True) * q
        if self.residual == "sps":
            residual = self._residual(p, q, np.zeros(q.shape, dtype=bool))
            standard = kept + rejected.sum(-1, keepdims=True) * residual
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                weight = np.where(rejected > 0, rejected / (1.0 - np.minimum(p, q)), 0.0)
            total = weight.sum(-1, keepdims=True)
            standard = kept + q * (total - weight) + weight * np.maximum(q - p, 0.0)
        return np.where(relaxed[..., None], relaxed_law, standard)

    def _logits_exact(self, p, q, lg):
        if lg.target_known is None:
            return True
        # the two largest processed logits must be stored (a top-K trace stores the largest K)
        return np.sum(lg.target_known & (q > 0), axis=-1) >= np.minimum(2, np.sum(q > 0, axis=-1))


def _host_logits(b, lg):
    """``lg`` with its target logits as host float64 (the rule's ranking runs on the host)."""
    import dataclasses

    return dataclasses.replace(lg, target=np.asarray(b.to_numpy(lg.target), dtype=np.float64))
