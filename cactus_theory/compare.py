"""Every rule compared on a trace: at the paper grid (``compare_rules``), block and strict verification against
token-wise (``compare_block_verification``), multi-draft and trees against the optimum of each drafting scheme
(``compare_multi_draft``), and the figures of these comparisons."""

from __future__ import annotations

from ._analysis._plotting import (
    plot_al_vs_kl,
    plot_delta_sweep,
    plot_delta_sweep_by_task,
    plot_rule_front,
    plot_step,
    rule_colours,
)
from ._studies._block_study import BlockComparison, compare_block_verification
from ._studies._trees import MULTI_DRAFT_METHODS, MultiDraftComparison, compare_multi_draft
from ._studies._zoo import compare_rules, comparison_entries, comparison_markdown, write_comparison

__all__ = [
    "MULTI_DRAFT_METHODS",
    "BlockComparison",
    "MultiDraftComparison",
    "compare_block_verification",
    "compare_multi_draft",
    "compare_rules",
    "comparison_entries",
    "comparison_markdown",
    "plot_al_vs_kl",
    "plot_delta_sweep",
    "plot_delta_sweep_by_task",
    "plot_rule_front",
    "plot_step",
    "rule_colours",
    "write_comparison",
]
