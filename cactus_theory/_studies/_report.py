"""The main job: a self-contained report (Markdown + HTML + PNG figures) from the embedded trace
and a synthetic suite, offline, in a few minutes on two cores."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import html
import os
import time

from .._analysis._cost import DEFAULT_COST_PROFILE
from .._util._files import check_output, publish_directory
from .._util._progress import say as _say
from .._util._results import figure_png as _png
from .._util._results import interval
from ._report_figures import _fig_emitted_kl, _fig_entropy, _fig_gamma, _fig_overspend, worst_case_curve

__all__ = ["build_report"]


def _model_name(entry) -> str:
    """A model as a report names it: its name and the sha256 prefix of its first file."""
    if not isinstance(entry, dict):
        return "?"
    files = entry.get("files") or {}
    first = next(iter(files.values()), None)
    sha = first.get("sha256") if isinstance(first, dict) else first
    return f"{entry.get('name', '?')}" + (f" (sha256 {sha[:12]}...)" if isinstance(sha, str) else "")


PLAN_MS = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20)
#: The measured GPU profile the report's GPU section uses (``CostModel.from_profile``).
GPU_PROFILE = DEFAULT_COST_PROFILE


def _plans(trace, result):
    """{key: (title, Plan)}: this machine's calibration (when there is one; with its problems, if
    any, printed under the table) and a measured GPU profile (``GPU_PROFILE``), from ``result``,
    an analysis of ``trace`` at the m values of PLAN_MS."""
    from .._analysis._calibrations import find_calibration
    from .._analysis._cost import CostModel
    from .._analysis._plan import predict_speedup

    plans = {}
    cost = find_calibration(trace)
    if cost is not None:
        src = cost.source
        title = (
            f"This machine, calibrated ({src.get('dtype', '?')} on {src.get('device', '?')}, {src.get('created', '')})"
        )
        plans["machine"] = (title, predict_speedup(result, cost, allow_untrusted=True))
    gpu = CostModel.from_profile(GPU_PROFILE)
    src = gpu.source
    plans["gpu_profile"] = (
        f"A measured GPU profile: {src['verifier']} verifying, {src['draft']} drafting, {src['engine']} on one "
        f"{src['hardware']} at batch size 1 ({src['repository']}@{src['commit'][:7]}, {src['path']}; the trace's AL "
        "is of a smaller pair)",
        predict_speedup(result, gpu),
    )
    return plans


BLOCK_MS = (1, 2, 4, 8, 12, 16, 20)
#: The batch sizes and rules of the report's concurrency table (``plan --batch`` runs any).
REPORT_BATCHES = (1, 8, 32, 128, 512)
CONCURRENCY_RULES = ("sps", "tas", "cactus(delta=1)", "cactus-exact(delta=1)", "mentored(delta=1)")


def batch_section(result):
    """Markdown: per rule its best m and per-step throughput speedup at each of ``REPORT_BATCHES``
    under the GPU profile (batch 1 measured, larger batches modelled by the roofline fitted to the
    shipped profiles) and its break-even batch (``batch_plan`` / ``break_even``)."""
    from .._analysis._cost import CostModel
    from .._analysis._plan import batch_plan, break_even

    plans = batch_plan(result, CostModel.from_profile(GPU_PROFILE), REPORT_BATCHES)
    lines = [
        f"Per-step throughput speedup over a full batch at each rule's best m, against the verifier alone at the same "
        f"batch size, under {GPU_PROFILE} (measured at batch 1; larger batches modelled by the roofline fitted to the "
        "shipped profiles: `docs/results/speedups-at-concurrency.md`), with the break-even batch (the smallest size "
        "from which on the best m no longer beats the verifier alone):",
        "",
        "| rule | " + " | ".join(f"B = {b}" for b in REPORT_BATCHES) + " | break-even B |",
        "|---|" + "---|" * (len(REPORT_BATCHES) + 1),
    ]
    for row in break_even(plans):
        if row["draft_policy"]:
            continue
        cells = [f"{row['per_batch'][b]['speedup']:.2f}x (m = {row['per_batch'][b]['m']})" for b in REPORT_BATCHES]
        lines.append(f"| {row['rule']} | " + " | ".join(cells) + f" | {row['verdict']} |")
    return "\n".join(lines)


#: Bootstrap resamples of every section (the commands' and experiments' default too): one
#: resampling of the sequences, so a quantity printed in two sections has one interval.
REPORT_RESAMPLES = 1000
TABLE_CAPTION = (
    "Every main rule at each delta and m on the whole trace (all tasks): acceptance, AL with its bootstrap 95% "
    "interval over sequences, and the drift of what it emits from the verifier; the columns are explained below "
    "the table."
)


def block_section(trace, progress=None, ms=BLOCK_MS, n_boot=None, block_paths=256):
    """(Markdown, PNG) of block verification against SpS and strict verification on ``trace``
    (``compare_block_verification``): AL(m) with bootstrap intervals under sampled and greedy
    drafting, and block's gain over SpS with a paired interval."""
    from ._block_study import compare_block_verification

    n_boot = REPORT_RESAMPLES if n_boot is None else n_boot
    result = compare_block_verification(trace, ms, n_boot=n_boot, block_paths=block_paths, progress=progress)
    lines = [
        "AL(m) with bootstrap 95% intervals; block vs sps is AL(block) / AL(sps) - 1, paired (both on the same "
        f"resampled sequences). The block rule's AL is exact for m <= 3 and Monte Carlo beyond ({block_paths} drafted "
        "paths per block start; `experiments/block_verification.py` runs 1,024 and every m).",
        "",
    ]
    for mode in ("sampled", "greedy"):
        lines += [f"{mode.capitalize()} drafting:", "", result.markdown_table(mode), ""]
    return "\n".join(lines), _png(result.figure())


#: The sequence-level section's block sizes (``experiments/sequence_rules.py`` runs m = 4, 8, 20).
SEQUENCE_MS = (8,)


def sequence_section(trace, progress=None, ms=SEQUENCE_MS, n_boot=None, block_paths=32):
    """Markdown of the sequence-level methods on ``trace``: HSD's gain over SpS and over block
    verification (paired, both Monte Carlo over ``block_paths`` drafted blocks per start) with its
    drift, and the exact total variation of the first four tokens from the verifier's law on small
    vocabularies (``experiments/sequence_rules.py`` runs 1,024 paths, the trees and the rest)."""
    from .._analysis._analyze import analyze_trace
    from .._laws._sequence import sequence_tv_rows, small_cases

    n_boot = REPORT_RESAMPLES if n_boot is None else n_boot
    result = analyze_trace(
        trace, ["sps", "block", "hsd"], ms=ms, n_boot=n_boot, block_paths=block_paths, progress=progress
    )
    lines = [
        "Traversal Verification of a chain has block verification's law (its leaf-to-root walk is Sun et al.'s "
        "algorithm run backwards; the tests compare the two laws), so its AL is the block section's. HSD as its "
        "authors' code runs it (one sampled chain) accepts the whole block on the uncapped joint ratio: more AL "
        f"than block verification, and not lossless. HSD's AL is Monte Carlo ({block_paths} drafted blocks per "
        "start; gains paired with block verification's on the same sequences and paths):",
        "",
        "| m | hsd AL | over sps | over block | hsd KL/token | hsd TV/token |",
        "|---|---|---|---|---|---|",
    ]
    rows = {(r["rule"], r["m"]): r for r in result.rows if r["task"] == "all"}
    for m in result.ms:
        r = rows[("hsd", m)]
        cells = []
        for base in ("sps", "block"):
            ratio, lo, hi = result.al_ratio("hsd", base, m, n_boot=n_boot)
            cells.append(f"{100 * ratio:+.1f}% {interval(100 * lo, 100 * hi, '+.1f')}")
        lines.append(
            f"| {m} | {r['al']:.3f} {interval(r['al_lo'], r['al_hi'], '.3f')} | {cells[0]} | {cells[1]} | "
            f"{r['kl_per_token']:.4f} | {r['tv_per_token']:.4f} |"
        )
    cases = small_cases(seeds=(1, 2))
    rules = ("block", "traversal", "hsd")
    lines += [
        "",
        "Total variation of the law of the first 4 emitted tokens from the verifier's, exactly (every draft, coin "
        "and token enumerated; blocks of m = 2 drafts): 0 for a lossless rule.",
        "",
        "| case | " + " | ".join(rules) + " |",
        "|---|" + "---|" * len(rules),
    ]
    for row in sequence_tv_rows(rules, ms=(2,), cases=cases):
        lines.append(f"| {row['case']} | " + " | ".join(f"{row['tv'][rule]:.4f}" for rule in rules) + " |")
    return "\n".join(lines)


def multi_draft_section(trace, progress=None, ks=(1, 2, 4, 8), m=8, n_boot=None):
    """(Markdown, PNG) of multi-draft and tree verification against the optimum on ``trace``
    (``compare_multi_draft`` at k in ``ks`` and depth m; ``experiments/multi_draft.py`` runs
    k = 1..8 and m = 4, 8)."""
    from ._trees import compare_multi_draft

    n_boot = REPORT_RESAMPLES if n_boot is None else n_boot
    result = compare_multi_draft(trace, ks=ks, ms=(m,), n_boot=n_boot, progress=progress)
    text = (
        "Trees of depth m with k drafts per level; acceptance per position (some draft accepted) and tree AL under "
        "independent positions, each against the optimum of its own drafting scheme (`experiments/multi_draft.py` "
        "runs k = 1..8, m = 4 and 8): k i.i.d. drafts (rrs, spectr), k drafts without replacement (rrs without "
        "replacement), the top-k tokens of p (eagle-tree, sglang-tree). No lossless method passes its own scheme's "
        "optimum; the optima themselves compare the drafting schemes.\n\n" + result.markdown()
    )
    return text, _png(result.figure())


def _side_sections(trace, deltas):
    """The report's sections that need nothing of the main process's analysis, computed in a second
    process: {"gamma", "overspend": (PNG, caption), "worst": Gamma(delta)'s curve, "multi": (Markdown,
    PNG), "laps": [(section, seconds)]}. Deterministic: the same seeds as in the main process."""
    import matplotlib

    matplotlib.use("Agg")
    from .._data._trace import load_trace

    laps = []
    lap = _stopwatch(laps)
    out = {"gamma": _fig_gamma(), "overspend": _fig_overspend()}
    lap("gamma solvers and closed forms (2 figures)")
    out["worst"] = worst_case_curve(sorted(deltas))
    lap("Gamma(delta): worst-case search")
    tr = load_trace(trace)
    out["multi"] = multi_draft_section(tr)
    lap("multi-draft and tree verification")
    out["block"] = block_section(tr)
    lap("block verification, sampled and greedy drafting")
    out["sequence"] = sequence_section(tr)
    lap("sequence-level verification")
    out["laps"] = laps
    return out


def _stopwatch(laps, watched=None):
    """A function ``lap(section)`` that appends (section, seconds since the previous lap, or since now) to
    ``laps``; and, with ``watched`` (the second process's future), raises as soon as that process has died."""
    last = [time.perf_counter()]

    def lap(section):
        now = time.perf_counter()
        laps.append((section, now - last[0]))
        last[0] = now
        if watched is not None and watched.done() and watched.exception() is not None:
            _side_answer(watched)  # the second process died: say so now, not after this process's sections

    return lap


class _Inline:
    """``_side_sections`` run here, for a machine with one core: a future that is already done."""

    def __init__(self, trace, deltas):
        self.value = _side_sections(trace, deltas)

    def result(self):
        return self.value

    def done(self):
        return True

    def exception(self):
        return None


#: Whether the report's independent sections run in a second process (False: here, one after the other).
SIDE_PROCESS = True


def _start_side_sections(trace, deltas):
    """``_side_sections`` in a second process (spawned: a fresh interpreter, no inherited threads), or here
    when the machine has one core (or ``SIDE_PROCESS`` is False). Returns its future; ``_stop_side_sections``
    ends the process."""
    if not SIDE_PROCESS or (os.cpu_count() or 1) < 2:
        return _Inline(trace, deltas)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn"), initializer=_exit_with_parent, initargs=(os.getpid(),)
    )
    try:
        with _sigint_deferred():  # the process starts deaf to Ctrl-C (SIGINT blocked): the report handles it
            future = pool.submit(_side_sections, trace, deltas)
    except BaseException:  # a Ctrl-C that arrived while the process started
        _end_pool(pool, running=True)
        raise
    future.pool = pool
    return future


@contextlib.contextmanager
def _sigint_deferred():
    """Within the block (main thread only), SIGINT is blocked, so that a process started here has it blocked
    from its first instruction to its end (the mask is inherited through fork and exec): a Ctrl-C reaches
    the whole process group, and the second process's imports would otherwise print their own traceback.
    Here the handler stays as it was, so a Ctrl-C arriving within the block is not lost: another thread
    takes it and this one raises KeyboardInterrupt within the block, or (one thread) it stays pending and
    is raised as the block ends. The report itself ends the second process on Ctrl-C."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # runs a pending Ctrl-C's handler now


def _side_answer(future):
    """The second process's sections, or one line saying it died and what to do."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        return future.result()
    except BrokenProcessPool:
        raise RuntimeError(
            "the report's second process (the sections run on the other core) ended without an answer: killed, or "
            "out of memory; rerun the report (with one core, or SIDE_PROCESS off, every section runs in this process)"
        ) from None


def _exit_with_parent(parent, every=0.5):
    """In the second process: end it as soon as its parent ``parent`` is gone, however the parent ended (a
    SIGKILL or SIGTERM runs none of the parent's clean-up, and a finished worker would wait forever to hand
    its answer to nobody). A daemon thread that polls the parent's pid every ``every`` seconds."""
    import threading

    def watch():
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _stop_side_sections(future):
    """End the second process: at once when the report failed or was interrupted (its work is not waited
    for), after its answer otherwise."""
    pool = getattr(future, "pool", None)
    if pool is not None:
        _end_pool(pool, running=not future.done())


def _end_pool(pool, running):
    """Shut the second process's pool down; ``running``: its work is not waited for (the process is ended)."""
    if running:
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


_HTML_STYLE = (
    "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;font-size:12px;"
    "margin:8px 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f2f2f2}"
    "code{background:#f6f6f6}figure{margin:16px 0}img{max-width:100%}</style>"
)


def _inline_html(text):
    """One line of Markdown to HTML: escaped, with `code` and **bold**."""
    import re

    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def markdown_html(text):
    """The Markdown the report writes (pipe tables, bullet lists, paragraphs, fenced code) as HTML:
    tables become tables, not pipe text."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("|"):
            block = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                block.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            head, rows = block[0], block[1:]
            if rows and all(set(c) <= set("-: ") for c in rows[0]):
                rows = rows[1:]  # the alignment row
            cells = "".join(f"<th>{_inline_html(c)}</th>" for c in head)
            body = "".join("<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in r) + "</tr>" for r in rows)
            out.append(f"<table><tr>{cells}</tr>{body}</table>")
        elif line.startswith("```"):
            i += 1
            code = []
            while i < len(lines) and not lines[i].startswith("```"):
                code.append(lines[i])
                i += 1
            i += 1
            out.append(f"<pre>{html.escape(chr(10).join(code))}</pre>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline_html(lines[i][2:])}</li>")
                i += 1
            out.append(f"<ul>{''.join(items)}</ul>")
        elif line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 1, 6)
            out.append(f"<h{level}>{_inline_html(line.lstrip('#').strip())}</h{level}>")
            i += 1
        elif line.strip():
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].lstrip().startswith(("|", "- ", "```", "#")):
                para.append(_inline_html(lines[i]))
                i += 1
            out.append(f"<p>{' '.join(para)}</p>")
        else:
            i += 1
    return "\n".join(out)


def build_report(
    out_dir="cactus_report",
    trace=None,
    deltas=(0.25, 0.5, 1.0, 2.0),
    ms=(4, 8, 20),
    rules="sps,tas,topk,cactus,cactus-exact,mentored",
    progress=None,
    max_positions=None,
    timings=None,
):
    """Write ``report.md``, ``report.html`` and PNG figures into ``out_dir``; return the summary table.

    ``timings``: a list that receives (section, seconds) for each part of the report (the same
    table ends report.md: where the main job's time goes, so that a regression shows).

    Nothing is written until every part is computed; then the files are published through a
    staging directory, the index files last (``publish_directory``), so a report killed midway
    leaves either the old report or the new one, and no temporary files (a killed process's
    staging directory is removed by the next run). Other files in ``out_dir`` are left alone.
    """
    import matplotlib

    matplotlib.use("Agg")
    from .._analysis._analyze import analyze_trace, parse_rules
    from .._analysis._outputs import analysis_figures
    from .._data._trace import load_trace

    check_output(out_dir, what="out_dir")  # before minutes of work, not after
    start = time.perf_counter()

    def say(message):
        _say(message, progress)

    laps = [] if timings is None else timings
    figures = []
    # the sections that need nothing of the analysis run in a second process on the other core meanwhile: the
    # gamma figures, Gamma(delta)'s search, multi-draft and tree, block and sequence-level verification (on a
    # first run each process also compiles its own kernels, so the compiling is shared too)
    say("[1/3] gamma figures, Gamma(delta), multi-draft, tree, block and sequence-level verification")
    side = _start_side_sections(getattr(trace, "directory", trace), deltas)
    inline = isinstance(side, _Inline)  # computed here already, one section after the other
    lap = _stopwatch(laps, side)  # the main process's sections from here (the side's laps come with its answer)
    try:
        say("[2/3] rules on the trace")
        tr = load_trace(trace)
        # one analysis serves the tables, the figures (at ms) and the plans (at PLAN_MS)
        full = analyze_trace(
            tr, parse_rules(rules, deltas), ms=sorted({*ms, *PLAN_MS}), n_boot=REPORT_RESAMPLES, progress=progress
        )
        result = dataclasses.replace(full, rows=[r for r in full.rows if r["m"] in ms])
        for name, data in analysis_figures(result).items():
            caption = {
                "acceptance_al_vs_delta.png": "Mean acceptance and AL (with bootstrap 95% intervals over sequences) "
                "against delta per rule on the trace; dashed lines: rules without a budget.",
                "al_vs_kl.png": "The trade-off front: AL against the mean KL(pi || q) of what each rule emits.",
                "al_vs_delta_by_task.png": "AL against delta per task (bootstrap 95% intervals over that task's "
                "sequences): where the tasks differ, the all-task averages hide it.",
            }[name]
            figures.append(
                (
                    name,
                    data,
                    caption + f" Trace: {len(tr)} sequences, {tr.n_positions} positions; settings {result.settings}.",
                )
            )
        lap("the trace: main rules over delta and m (analysis, 3 figures)")
        say("      every rule at the paper grid's parameters")
        from .._analysis._plotting import plot_rule_front
        from ._zoo import compare_rules, comparison_markdown

        comparison = compare_rules(tr, n_boot=REPORT_RESAMPLES, progress=progress)
        zoo_md = comparison_markdown(comparison)
        figures.append(
            (
                "rules_front.png",
                _png(plot_rule_front(comparison, m=8)),
                "Every rule at the paper grid's parameters (graphcore-research/relaxed-spec-dec-repro's "
                "scripts/run_paper_grid.py, plus this package's rules): AL at "
                "m = 8 against the mean emitted KL(pi || q) (left; rules that emit tokens the verifier excludes sit at "
                "KL = inf) and TV(pi, q) (right), with the front of rules no other dominates.",
            )
        )
        lap("every rule at the paper grid's parameters")
        say("      predicted speedups: this machine's calibration, if any, and a measured GPU profile")
        plan_figures = []
        plans = _plans(tr, dataclasses.replace(full, rows=[r for r in full.rows if r["m"] in PLAN_MS]))
        for key, (title, plan) in plans.items():
            from .._analysis._plotting import plot_plan

            plan_figures.append(
                (
                    f"plan_{key}.png",
                    _png(plot_plan(plan, title=title)),
                    f"Predicted wall-time speedup over the verifier alone ({title}) of every rule at its best m "
                    "(1-20), with the interval from AL's bootstrap, against the mean emitted KL(pi || q); the front "
                    "of settings no other beats on both (cactus-theory plan).",
                )
            )
        concurrency = [r for r in full.rows if r["m"] in PLAN_MS and r["rule"] in CONCURRENCY_RULES]
        concurrency_md = batch_section(dataclasses.replace(full, rows=concurrency))
        lap("predicted speedups")
        if not inline:
            say("      waiting for the other core's sections")
        done = _side_answer(side)
    finally:
        _stop_side_sections(side)
    figures[:0] = [("gamma_forms.png", *done["gamma"]), ("taylor_overspend.png", *done["overspend"])]
    worst = done["worst"]
    block_md, block_png = done["block"]
    sequence_md = done["sequence"]
    multi_md, multi_png = done["multi"]
    figures.append(
        (
            "block_verification.png",
            block_png,
            "AL(m) of block verification, token-wise SpS and strict verification (all lossless) for m = 1-20, "
            "under sampled drafting (left) and greedy drafting (right: an MTP head or EAGLE drafter, p one-hot), "
            "with bootstrap 95% intervals over sequences.",
        )
    )
    figures.append(
        (
            "multi_draft.png",
            multi_png,
            "Acceptance per position (left) and tree AL at m = 8 (right) against k drafts per position: recursive "
            "rejection sampling (i.i.d. and without replacement), SpecTr, EAGLE-2/3's top-k children and the optimum "
            "for k i.i.d. drafts (dashed), with bootstrap 95% intervals over sequences.",
        )
    )
    figures += plan_figures
    lap("waiting for the other core's sections")
    for section, seconds in done["laps"]:
        laps.append((section if inline else f"{section} (on the other core, meanwhile)", seconds))
    figures.append(("emitted_kl_vs_delta.png", *_fig_emitted_kl(result, worst)))
    figures.append(("entropy_change.png", *_fig_entropy(result)))
    lap("drift and entropy figures")
    say("[3/3] writing")
    table = result.table()
    md = [
        "# cactus_theory report",
        "",
        f"Trace: `{tr.directory}` ({len(tr)} sequences, {tr.n_positions} positions). "
        f"Verifier: {_model_name(tr.metadata.get('verifier'))}; draft: {_model_name(tr.metadata.get('draft'))}.",
        "",
        TABLE_CAPTION,
        "",
        "```",
        table,
        "```",
        "",
        "The columns:",
        "",
        "```",
        result.legend(),
        "```",
        "",
        "## Every rule at the paper grid's parameters",
        "",
        zoo_md,
        "",
        "## Block verification and the engines' lossless methods",
        "",
        block_md,
        "",
        "## Sequence-level verification: HSD and Traversal Verification",
        "",
        sequence_md,
        "",
        "## Multi-draft and tree verification",
        "",
        multi_md,
        "",
        "## Predicted speedups",
        "",
    ]
    for title, plan in plans.values():
        md += [f"{title}. {plan.scope()}", "", "```", plan.table(), "```", ""]
    md += ["### At serving concurrency", "", concurrency_md, ""]
    if "machine" not in plans:
        md += [
            "No calibration of this trace's model pair on this machine was found; `cactus-theory calibrate "
            "--verifier ... --draft ...` writes one where this report looks for it.",
            "",
        ]
    for name, _, caption in figures:
        md += [f"![{name}]({name})", "", caption, ""]
    lap("writing the pages")
    md += ["## Where the time went", "", "| section | seconds |", "|---|---|"]
    md += [f"| {name} | {seconds:.1f} |" for name, seconds in laps]
    md.append(f"| total | {time.perf_counter() - start:.1f} |")
    md += ["", f"Generated in {time.perf_counter() - start:.0f} s ({os.cpu_count()} cores)."]
    files = {name: data for name, data, _ in figures}
    files["report.md"] = "\n".join(md)
    plan_text = "\n\n".join(f"{title}. {plan.scope()}\n{plan.table()}" for title, plan in plans.values())
    at = md.index("## Where the time went")
    timing_md = "\n".join(md[at + 2 : at + 5 + len(laps)])
    body = [
        _HTML_STYLE,
        f"<h1>cactus_theory report</h1><p>{html.escape(TABLE_CAPTION)}</p><pre>{html.escape(table)}</pre>",
        f"<p>The columns:</p><pre>{html.escape(result.legend())}</pre>",
        f"<h2>Every rule at the paper grid's parameters</h2>{markdown_html(zoo_md)}",
        f"<h2>Block verification and the engines' lossless methods</h2>{markdown_html(block_md)}",
        "<h2>Sequence-level verification: HSD and Traversal Verification</h2>" + markdown_html(sequence_md),
        f"<h2>Multi-draft and tree verification</h2>{markdown_html(multi_md)}",
        f"<h2>Predicted speedups</h2><pre>{html.escape(plan_text)}</pre>",
        f"<h3>At serving concurrency</h3>{markdown_html(concurrency_md)}",
    ]
    for _name, data, caption in figures:
        b64 = base64.b64encode(data).decode()
        body.append(
            f'<figure><img src="data:image/png;base64,{b64}"/><figcaption>{html.escape(caption)}</figcaption></figure>'
        )
    body.append(f"<h2>Where the time went</h2>{markdown_html(timing_md)}")
    files["report.html"] = '<html><head><meta charset="utf-8"></head><body>' + "\n".join(body) + "</body></html>"
    # everything is built before anything is published; the index files go last
    publish_directory(files, out_dir, last=("report.md", "report.html"))
    return table
