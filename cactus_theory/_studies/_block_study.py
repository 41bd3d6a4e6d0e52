"""Block verification against token-wise SpS and strict verification on a trace, under sampled
and greedy drafting (``compare_block_verification``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._util._results import Result, interval

__all__ = ["BlockComparison", "compare_block_verification"]


#: The lossless methods ``compare_block_verification`` puts side by side.
BLOCK_COMPARISON_RULES = ("sps", "strict", "block")


@dataclass(frozen=True)
class BlockComparison(Result):
    """``compare_block_verification``'s result.

    Attributes
    ----------
    ms : tuple
        The block sizes compared.
    rows : dict {draft mode: list of AnalysisRow}
        The analysis rows (task "all") of ``BLOCK_COMPARISON_RULES`` under "sampled" and
        "greedy" drafting.
    gain : dict {draft mode: {m: (value, lo, hi)}}
        AL(block) / AL(sps) - 1 with its paired bootstrap interval (``AnalysisResult.al_ratio``).
    seconds : dict {draft mode: seconds}
        The analysis time of each mode.
    """

    ms: tuple
    rows: dict
    gain: dict
    seconds: dict
    name: ClassVar[str] = "block_verification"

    def records(self) -> list:
        """Every analysis row of both draft modes; block's rows carry its gain over SpS
        (``block_vs_sps`` with ``_lo`` / ``_hi``)."""
        out = []
        for mode in ("sampled", "greedy"):
            for r in self.rows[mode]:
                row = dict(r)
                if r["rule"] == "block":
                    row["block_vs_sps"], row["block_vs_sps_lo"], row["block_vs_sps_hi"] = self.gain[mode][r["m"]]
                out.append(row)
        return out

    def _cells(self, mode):
        rows = {(r["rule"], r["m"]): r for r in self.rows[mode]}
        for m in self.ms:
            cells = [
                f"{rows[(rule, m)]['al']:.3f} {interval(rows[(rule, m)]['al_lo'], rows[(rule, m)]['al_hi'])}"
                for rule in BLOCK_COMPARISON_RULES
            ]
            g = [round(x, 6) + 0.0 for x in self.gain[mode][m]]  # + 0.0: no "-0.00%" from rounding noise
            yield m, cells, f"{g[0]:+.2%} {interval(g[1], g[2], percent=True)}"

    def table(self, mode=None) -> str:
        """AL(m) with its bootstrap 95% interval per rule, and block's gain over SpS (paired), as
        fixed-width text: one draft mode, or both (None)."""
        lines = []
        for one in (mode,) if mode else ("sampled", "greedy"):
            lines.append(f"{one} drafting")
            lines.append(f"{'m':>3} " + " ".join(f"{r:>20}" for r in BLOCK_COMPARISON_RULES) + f" {'block vs sps':>28}")
            for m, cells, gain in self._cells(one):
                lines.append(f"{m:>3} " + " ".join(f"{c:>20}" for c in cells) + f" {gain:>28}")
        return "\n".join(lines)

    def markdown_table(self, mode) -> str:
        """The Markdown table of one draft mode."""
        lines = ["| m | sps | strict | block | block vs sps |", "|---|---|---|---|---|"]
        lines += [f"| {m} | " + " | ".join(cells) + f" | {gain} |" for m, cells, gain in self._cells(mode)]
        return "\n".join(lines)

    def markdown(self) -> str:
        """Both draft modes' tables."""
        return "\n\n".join(
            f"{mode.capitalize()} drafting:\n\n{self.markdown_table(mode)}" for mode in ("sampled", "greedy")
        )

    def figure(self):
        """AL(m) with its interval per rule, sampled drafting (left) and greedy drafting (right)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from .._analysis._plotting import rule_colours

        colours = rule_colours(BLOCK_COMPARISON_RULES)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, mode in zip(axes, ("sampled", "greedy"), strict=True):
            for rule in BLOCK_COMPARISON_RULES:
                rs = sorted((r for r in self.rows[mode] if r["rule"] == rule), key=lambda r: r["m"])
                ax.errorbar(
                    [r["m"] for r in rs],
                    [r["al"] for r in rs],
                    yerr=[[r["al"] - r["al_lo"] for r in rs], [r["al_hi"] - r["al"] for r in rs]],
                    marker="o",
                    ms=3,
                    capsize=2,
                    color=colours[rule],
                    label=rule,
                )
            ax.set_xlabel("m (drafted tokens per verification)")
            ax.set_title(f"{mode} drafting")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("AL(m): accepted drafts per verification")
        axes[0].legend()
        fig.tight_layout()
        return fig


def compare_block_verification(trace, ms=tuple(range(1, 21)), n_boot=1000, block_paths=1024, progress=None):
    """Block verification against token-wise SpS and strict verification on ``trace`` (anything
    ``analyze_trace`` takes): AL(m) with bootstrap intervals under sampled and greedy drafting,
    and block's gain over SpS with a paired interval. The block rule's AL is exact where its
    weights' support is small (m <= 3 on a top-20 trace), else Monte Carlo with ``block_paths``
    paths per block start. Returns a ``BlockComparison``."""
    import time

    from .._analysis._analyze import analyze_trace

    ms = tuple(ms)
    rows, gain, seconds = {}, {}, {}
    for mode in ("sampled", "greedy"):
        start = time.perf_counter()
        result = analyze_trace(
            trace,
            list(BLOCK_COMPARISON_RULES),
            ms=ms,
            n_boot=n_boot,
            draft_mode=mode,
            progress=progress,
            block_paths=block_paths,
        )
        rows[mode] = [r for r in result.rows if r["task"] == "all"]
        gain[mode] = {m: result.al_ratio("block", "sps", m, n_boot) for m in result.ms}
        seconds[mode] = time.perf_counter() - start
    return BlockComparison(ms=result.ms, rows=rows, gain=gain, seconds=seconds)
