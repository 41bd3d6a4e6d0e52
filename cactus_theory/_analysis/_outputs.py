"""What an analysis writes: its tables (CSV, JSON) and figures, atomically, into a directory."""

from __future__ import annotations

import os

from .._util._files import atomic_write

__all__ = ["analysis_figures", "write_outputs"]


def write_outputs(result, out_dir: str, figures: bool = True) -> list[str]:
    """analysis.csv, analysis.json and (optionally) figures into ``out_dir``, atomically."""
    written = []

    def put(name, data):
        written.append(atomic_write(os.path.join(out_dir, name), data))

    put("analysis.csv", result.to_csv())
    put("analysis.json", result.to_json())
    if figures:
        for name, data in analysis_figures(result).items():
            put(name, data)
    return written


def analysis_figures(result) -> dict:
    """PNG bytes of the analysis figures (``_plotting``): acceptance and AL against delta per
    rule, AL against emitted KL, and AL against delta per task when the trace has several."""
    import matplotlib

    matplotlib.use("Agg")
    from .._util._results import figure_png
    from ._plotting import plot_al_vs_kl, plot_delta_sweep, plot_delta_sweep_by_task

    out = {
        "acceptance_al_vs_delta.png": figure_png(plot_delta_sweep(result.rows, result.settings)),
        "al_vs_kl.png": figure_png(plot_al_vs_kl(result.rows)),
    }
    if len({r["task"] for r in result.rows} - {"all"}) > 1:
        out["al_vs_delta_by_task.png"] = figure_png(plot_delta_sweep_by_task(result.rows))
    return out
