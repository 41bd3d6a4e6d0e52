"""Figures that tell the truth: every figure the report writes passes ``figure_problems`` (no
overlapping or clipped text, no marker cut by the frame, no two legend entries alike, intervals
where the caption promises them), the checker catches each fault on a figure built to have it,
and a rule's colour depends on its name only."""

from __future__ import annotations

import re

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import json

import matplotlib.pyplot as plt

from cactus_theory._analysis import _plotting
from cactus_theory._analysis._plotting import (
    BUILTIN_COLOURS,
    PALETTE,
    family_colour,
    figure_problems,
    rule_colours,
)
from cactus_theory._util import _results


def _lab(hex_colour):
    """CIELAB (D65) of an sRGB colour, written out (the standard formulas, not matplotlib's)."""
    rgb = np.array(matplotlib.colors.to_rgb(hex_colour))
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = m @ lin / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


# --- the report's figures, as written, with their captions -------------------------------------


@pytest.fixture(scope="module")
def report_figures(tmp_path_factory):
    """{file name: (Figure, caption)} of every figure ``build_report`` writes, captured as drawn
    (each PNG replaced by a marker that names its figure), captions read from report.md."""
    from cactus_theory._studies import _report, _report_figures

    out = tmp_path_factory.mktemp("report") / "r"
    drawn = []

    def capture(fig, dpi=110):
        drawn.append(fig)
        return f"FIGURE {len(drawn) - 1}".encode()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_report, "SIDE_PROCESS", False)  # every figure drawn in this process, where it is captured
        for module in (_report, _report_figures):  # each module that draws a report figure
            mp.setattr(module, "_png", capture)
        mp.setattr(_results, "figure_png", capture)  # Result.figure and the zoo's figures
        _report.build_report(str(out), progress=False, max_positions=2500)
    md = (out / "report.md").read_text()
    # run here, one section after the other: the time table says so (no "meanwhile")
    assert "| Gamma(delta): worst-case search |" in md and "meanwhile" not in md
    figures = {}
    for path in sorted(out.glob("*.png")):
        index = int(path.read_bytes().decode().split()[1])
        found = re.search(rf"!\[{re.escape(path.name)}\]\({re.escape(path.name)}\)\n\n(.+)\n", md)
        assert found, f"report.md has no caption for {path.name}"
        figures[path.name] = (drawn[index], found.group(1))
    yield figures
    for fig in drawn:
        plt.close(fig)


def test_the_report_writes_the_figures_this_test_expects(report_figures):
    assert {
        "acceptance_al_vs_delta.png",
        "al_vs_kl.png",
        "al_vs_delta_by_task.png",
        "rules_front.png",
        "block_verification.png",
        "multi_draft.png",
        "plan_gpu_profile.png",
        "emitted_kl_vs_delta.png",
        "entropy_change.png",
        "gamma_forms.png",
    } <= set(report_figures)


@pytest.mark.parametrize(
    "name",
    [
        "acceptance_al_vs_delta.png",
        "al_vs_kl.png",
        "al_vs_delta_by_task.png",
        "rules_front.png",
        "block_verification.png",
        "multi_draft.png",
        "plan_gpu_profile.png",
        "emitted_kl_vs_delta.png",
        "entropy_change.png",
        "gamma_forms.png",
        "taylor_overspend.png",
    ],
)
def test_a_report_figure_has_no_problem_a_reader_would_trip_on(report_figures, name):
    if name not in report_figures:
        pytest.fail(f"the report no longer writes {name}")
    fig, caption = report_figures[name]
    assert figure_problems(fig, caption) == []


def test_the_rules_of_one_figure_have_distinct_colours(report_figures):
    for name in ("acceptance_al_vs_delta.png", "al_vs_kl.png", "rules_front.png", "plan_gpu_profile.png"):
        fig, _ = report_figures[name]
        for ax in fig.axes:
            handles, labels = ax.get_legend_handles_labels()
            families = {}
            for handle, label in zip(handles, labels, strict=True):
                if label in ("front", "verifier alone") or label.startswith("KL bound"):
                    continue
                family = label.split("(")[0].split(" [")[0]
                families.setdefault(family, set()).add(_plotting._style(handle)[0])
            colours = [c for cs in families.values() for c in cs]
            assert all(len(cs) == 1 for cs in families.values()), f"{name}: a family drawn in two colours"
            assert len(colours) == len(set(colours)), f"{name}: two families share a colour"


def test_the_acceptance_panel_draws_the_intervals_its_caption_promises(report_figures):
    fig, caption = report_figures["acceptance_al_vs_delta.png"]
    assert "interval" in caption
    acceptance = fig.axes[0]
    bars = [c for c in acceptance.containers if isinstance(c, matplotlib.container.ErrorbarContainer)]
    assert bars, "no error bars on the acceptance panel"
    # the axis spans the intervals, so they are visible, not cut
    lo, hi = acceptance.get_ylim()
    for bar in bars:
        for segments in bar.lines[2]:
            for (_, y0), (_, y1) in segments.get_segments():
                assert lo < min(y0, y1) and max(y0, y1) < hi


# --- the checker catches each fault ---------------------------------------------------------------


def _clean():
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.errorbar([1, 2, 3], [1.0, 2.0, 1.5], yerr=0.1, marker="o", label="a", color=PALETTE[0])
    ax.plot([1, 2, 3], [1.5, 1.2, 1.8], marker="s", label="b", color=PALETTE[1])
    ax.margins(0.1)
    ax.set_title("a title")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig, ax


def test_a_clean_figure_passes_the_checker():
    fig, _ = _clean()
    assert figure_problems(fig, "with 95% intervals") == []
    plt.close(fig)


def test_the_checker_finds_overlapping_annotations():
    fig, ax = _clean()
    ax.annotate("m=20", (2, 2.0), fontsize=8)
    ax.annotate("m=16", (2.02, 2.0), fontsize=8)
    assert any("overlap" in p for p in figure_problems(fig))
    plt.close(fig)


def test_the_checker_finds_a_clipped_title():
    fig, ax = _clean()
    ax.set_title("a title far too long for its figure " * 6)
    assert any("cut by the figure's edge" in p for p in figure_problems(fig))
    plt.close(fig)


def test_the_checker_finds_two_rules_in_one_colour():
    fig, ax = _clean()
    ax.lines[-1].set_color(PALETTE[0])
    ax.lines[-1].set_marker("o")
    ax.legend()
    assert any("look the same" in p for p in figure_problems(fig))
    plt.close(fig)


def test_the_checker_finds_a_caption_promising_intervals_the_axes_lack():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 2, 3], marker="o", label="x")
    ax.margins(0.1)
    ax.legend()
    assert any("promises intervals" in p for p in figure_problems(fig, "AL with bootstrap 95% intervals"))
    assert figure_problems(fig, "AL against m") == []
    two = plt.figure()
    left, right = two.subplots(1, 2)
    left.errorbar([1, 2], [1, 2], yerr=0.1, marker="o")
    right.plot([1, 2], [1, 2], marker="o")
    for ax in (left, right):
        ax.margins(0.2)
    assert figure_problems(two, "Left: AL with intervals. Right: the worst case found.") == []
    assert any("axes 1" in p for p in figure_problems(two, "Left: AL. Right: AL with intervals."))
    plt.close(fig)
    plt.close(two)


def test_the_checker_finds_a_marker_cut_by_the_frame_and_markers_no_legend_explains():
    fig, ax = _clean()
    ax.set_xlim(left=1.0)  # the first points sit on the frame
    assert any("cut by the axes' frame" in p for p in figure_problems(fig))
    ax.set_xlim(0.5, 3.5)
    ax.scatter([2.5], [1.1], marker="D", color=PALETTE[2])  # a setting's marker, not in the legend
    assert any("no legend explains" in p for p in figure_problems(fig))
    plt.close(fig)


# --- colours: from the name, never from a position -------------------------------------------------


def test_every_builtin_rule_has_its_own_fixed_colour_far_from_the_others():
    from cactus_theory import available_rules

    builtins = sorted(n for n, info in available_rules().items() if info.builtin)
    assert set(builtins) <= set(BUILTIN_COLOURS), "a built-in rule without a colour in BUILTIN_COLOURS"
    indices = [BUILTIN_COLOURS[n] for n in builtins]
    assert len(set(indices)) == len(indices)
    labs = [_lab(PALETTE[i]) for i in range(len(PALETTE))]
    gaps = [np.linalg.norm(a - b) for i, a in enumerate(labs) for b in labs[i + 1 :]]
    assert min(gaps) > 20  # CIE76: distinct at a glance (2.3 is a just noticeable difference)
    for name in builtins:
        assert family_colour(name) == PALETTE[BUILTIN_COLOURS[name]]


def test_a_colour_depends_on_the_names_plotted_not_their_order():
    names = ["tas", "my-rule", "sps", "cactus", "another-rule", "block"]
    first = rule_colours(names)
    assert rule_colours(list(reversed(names))) == first
    assert len(set(first.values())) == len(names)
    assert first["sps"] == family_colour("sps") and first["cactus"] == family_colour("cactus")


def test_a_plugin_moves_no_builtin_colour_and_gets_a_distinct_one(tmp_path):
    import subprocess
    import sys

    code = (
        "from dataclasses import dataclass\n"
        "from typing import ClassVar\n"
        "from cactus_theory import SpS\n"
        "@dataclass(frozen=True)\n"
        "class Mine(SpS):\n"
        "    'A plugin rule.'\n"
        "    name: ClassVar[str] = 'zz-plugin'\n"
        "    colour: ClassVar[str] = '#ff0000'\n"  # asks for cactus's colour
        "from cactus_theory._analysis._plotting import family_colour, rule_colours\n"
        "import json\n"
        "names = ['sps', 'cactus', 'tas', 'block', 'zz-plugin']\n"
        "print(json.dumps([family_colour(n) for n in names] + [rule_colours(names)[n] for n in names]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout

    colours = json.loads(out.strip().splitlines()[-1])
    asked, given = colours[:5], colours[5:]
    assert asked[:4] == [family_colour(n) for n in ("sps", "cactus", "tas", "block")]
    assert asked[4] == "#ff0000"  # the class's declared colour is what it asks for
    assert given[:4] == asked[:4]  # no built-in moves
    assert given[4] not in given[:4]  # the plugin moves off cactus's colour


def test_family_colours_are_one_per_family_and_plan_labels_do_not_overlap():
    import matplotlib

    matplotlib.use("Agg")
    from cactus_theory import analyze_trace, load_trace, predict_speedup
    from cactus_theory._analysis._plotting import family_colour
    from cactus_theory.plan import plot_plan
    from cactus_theory.traces import parse_rules

    assert family_colour("cactus") == family_colour("cactus") != family_colour("sps")
    names = sorted(__import__("cactus_theory").available_rules())
    assert len({family_colour(n) for n in names}) == len(names)
    result = analyze_trace(
        load_trace(),
        parse_rules("sps,tas,cactus,cactus-exact,mentored", (0.25, 0.5, 1, 2)),
        ms=(2, 4, 8, 12, 20),
        n_boot=100,
        tasks=["gsm8k"],
    )
    fig = plot_plan(predict_speedup(result, 0.05))
    fig.canvas.draw()
    ax = fig.axes[0]
    boxes = [t.get_window_extent() for t in ax.texts]
    assert boxes
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), "two m= labels overlap"
    # the legend's colour of a family is its colour everywhere
    handles, labels = ax.get_legend_handles_labels()
    handle = handles[next(i for i, x in enumerate(labels) if x.startswith("cactus(delta="))]
    line = handle.lines[0] if hasattr(handle, "lines") else handle  # an errorbar container: its marker line
    assert np.allclose(matplotlib.colors.to_rgb(line.get_color()), matplotlib.colors.to_rgb(family_colour("cactus")))
