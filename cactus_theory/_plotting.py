"""Figures for one step of a rule (matplotlib; used by the docs, notebooks and the report)."""

from __future__ import annotations

import numpy as np

__all__ = ["plot_step"]


def plot_step(rule, draft_probs, target_probs, ax=None, top=None):
    """Bar chart of the draft p, the verifier q and what one step of ``rule`` emits, pi (exact).

    ``top`` keeps the ``top`` tokens with the largest q (default: all). The title gives the
    expected acceptance sum_n p(n) a_n and KL(pi || q). Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    from ._emitted import step_metrics

    p = np.asarray(draft_probs, dtype=np.float64)
    q = np.asarray(target_probs, dtype=np.float64)
    if p.ndim != 1 or q.shape != p.shape:
        raise ValueError(f"draft_probs and target_probs must be 1-D of one length; got {p.shape} and {q.shape}")
    metrics = step_metrics(rule, p, q)
    pi = np.asarray(metrics.emitted, dtype=np.float64)
    order = np.argsort(-q)[: top or q.size]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    x = np.arange(order.size)
    for k, (values, label) in enumerate(((p, "draft p"), (q, "verifier q"), (pi, "emitted pi"))):
        ax.bar(x + (k - 1) * 0.27, values[order], width=0.27, label=label)
    ax.set_xticks(x, [str(i) for i in order], fontsize=7)
    ax.set_xlabel("token (sorted by q)")
    ax.set_ylabel("probability")
    acceptance, drift = float(metrics.acceptance), float(metrics.kl_emitted_target)
    ax.set_title(f"{rule.describe()}: acceptance {acceptance:.3f}, KL(pi||q) {drift:.4f}", fontsize=9)
    ax.legend(fontsize=7)
    return ax
