"""``cactus-theory plan``: predicted speedups of every rule, delta and m.
Its arguments, then the code that runs them."""

from __future__ import annotations

import os

from .._analysis._cost import DEFAULT_COST_PROFILE
from ._common import (
    SAMPLING_FLAGS,
    _analysed,
    _check_out,
    _delta_help,
    _draft_mode_option,
    _floats,
    _gate,
    _gate_option,
    _given_flags,
    _int_at_least,
    _ints,
    _nonnegative,
    _progress,
    _progress_options,
    _resamples,
    _rules_epilog,
    _rules_option,
    _sampling_options,
    _tasks_to_show,
    _trace_argument,
    _trace_inputs,
    _traces,
    analysis_options,
)

ORDER = 6
HELP = "predicted wall-time speedup of every rule, delta and m on a trace, and the best setting"
EPILOG = _rules_epilog


def add_arguments(pl):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    _trace_argument(pl)
    costs = pl.add_mutually_exclusive_group()
    costs.add_argument("--cost", default=None, help="cost file from 'calibrate' (or written by hand)")
    costs.add_argument(
        "--cost-ratio",
        type=_nonnegative("a cost ratio", finite=True),
        default=None,
        help="a what-if: draft token cost / verifier token cost, block cost flat in m",
    )
    costs.add_argument(
        "--cost-profile",
        default=None,
        help="a published measured profile shipped with the package (default, when no cost is given: "
        f"{DEFAULT_COST_PROFILE}; an unknown name lists them)",
    )
    pl.add_argument(
        "--draft-policy",
        action="append",
        default=None,
        help="also plan with this drafting policy (p-min(0.4), entropy(1), accept-prob(0.3), cost-optimal, "
        "adaptive-verify: the verified length that pays; "
        "repeatable; 'auto': a sweep of each)",
    )
    pl.add_argument("--trust-cost", action="store_true", help="plan even from a cost model with problems")
    pl.add_argument(
        "--quality",
        default=None,
        metavar="RECORDS",
        help="the deployment decision: with the exact referee's records (evaluate --exact --out), every rule family's "
        "grid (declared by each rule) and SpS, each m: the predicted speedup against the exact accuracy difference, "
        "both with intervals, the front, and the fastest setting within --max-loss (--rules adds settings)",
    )
    pl.add_argument(
        "--long-answers",
        default=None,
        metavar="RECORDS",
        help="the deployment decision on long answers too (or instead of --quality): the sampled referee's records "
        "kept with rows (evaluate --rows 20 --out), every setting's accuracy difference from one pool of answers "
        "weighted by exact likelihoods; a setting is within --max-loss when every bound it has is",
    )
    pl.add_argument(
        "--max-loss",
        type=_nonnegative("a number of points", finite=True),
        default=None,
        help="with --quality: the accuracy budget, points (the loss's upper 95%% bound; default 0.5)",
    )
    pl.add_argument(
        "--prompt-tokens",
        type=_nonnegative("a token count", finite=True),
        default=None,
        help="prompt length of the predicted requests (default: the trace's, per task)",
    )
    pl.add_argument(
        "--output-tokens",
        type=_nonnegative("a token count", finite=True),
        default=None,
        help="output length of the predicted requests (default: the trace's, per task)",
    )
    pl.add_argument(
        "--max-kl",
        type=_nonnegative("a KL bound", finite=True, hint=" (leave --max-kl out for no bound)"),
        default=None,
        help="bound on the mean emitted KL(pi || q) per position",
    )
    _rules_option(pl)
    pl.add_argument("--delta", type=_floats, default=[0.25, 0.5, 1.0, 2.0], help=_delta_help())
    pl.add_argument("--m", type=_ints, default=[1, 2, 3, 4, 6, 8, 10, 12, 16, 20], help="draft lengths to compare")
    pl.add_argument("--task", action="append", default=None, help="only this task (repeatable)")
    pl.add_argument(
        "--batch",
        type=_ints,
        default=None,
        help="batch sizes, e.g. 1,2,4: per rule the best m and throughput speedup at each (the verifier alone at the "
        "same batch size) and the break-even batch; needs a cost model timed at them (calibrate --batch)",
    )
    pl.add_argument("--bootstrap", type=_resamples, default=1000, help="bootstrap resamples (0: no intervals)")
    pl.add_argument("--processes", type=_int_at_least(1), default=1, help="local worker processes over shards")
    pl.add_argument("--out", default=None, help="write plan.csv, plan.json, plan.png and the analysis here")
    _sampling_options(pl, temperature=None)  # --quality's chain; None: a trace's plan keeps its own sampling
    _draft_mode_option(pl)
    _gate_option(pl)
    _progress_options(pl)
    pl.set_defaults(func=run)
    return pl


def _print_batches(args, result, cost):
    """The ``--batch`` tables: per task, per rule its best m and throughput speedup at each batch size."""
    from .._analysis._plan import batch_plan, break_even
    from .._util._results import interval

    plans = batch_plan(
        result,
        cost,
        args.batch,
        max_kl=args.max_kl,
        allow_untrusted=args.trust_cost,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
    )
    sizes = sorted(plans)
    best = break_even(plans, "all")  # the best m of each rule over the tasks asked: the settings of the static rows
    for task in _tasks_to_show(next(iter(plans.values())).rows):
        rows = break_even(plans, task)
        what = "request" if rows and rows[0]["key"] == "request_speedup" else "per-step"
        print(
            f"\n{'all tasks' if task == 'all' else 'task ' + task}: {what} throughput speedup over the batch at its "
            "best m, against the verifier alone at the same batch size [95% interval]"
        )
        print(f"{'rule':<34} " + " ".join(f"{'B=' + str(b):>26}" for b in sizes) + f" {'break-even B':>13}")
        for row in rows:
            label = row["rule"] if not row["draft_policy"] else f"{row['rule']} [{row['draft_policy']}]"
            cells, key = [], row["key"]
            for b in sizes:
                r = row["per_batch"][b]
                cells.append(f"m={r['m']:<2} {r[key]:.2f}x {interval(r[key + '_lo'], r[key + '_hi'], '.2f')}".rjust(26))
            print(f"{label:<34} " + " ".join(cells) + f" {row['verdict']:>13}")
        print(
            "(break-even B: the smallest batch size given from which on the rule's best m no longer beats the "
            "verifier alone; > B: it pays at every size given; < B: at none; 'B1,B2 only': at those sizes only)"
        )
    _print_requests(args, cost, best)


def _print_requests(args, cost, rows):
    """Requests ending at their own times in static batches, and a verify budget in a full batch, at
    each rule's best m per batch size (``batch_requests``)."""
    from .._analysis._batch import batch_requests

    settings = {
        (row["rule"], b): r["m"] for row in rows if not row["draft_policy"] for b, r in row["per_batch"].items()
    }
    found = batch_requests(
        _traces(args),
        settings,
        cost,
        sorted({b for _, b in settings}),
        seed=0,
        tasks=args.task,
        draft_mode=args.draft_mode,
        gate=_gate(args),
    )
    if not found:
        return
    scope = "all tasks" if not args.task else "tasks " + ", ".join(sorted(set(args.task)))
    print(
        f"\n{scope}, per-step speedups at each rule's best m: static batches of the trace's requests, each "
        "leaving when done (throughput and mean per-request latency, exact; [min, max] over the batches), and a "
        "full batch (continuous batching) verifying every draft or a verify budget that may draft nothing "
        "(+- Monte Carlo standard error)"
    )
    print(
        f"{'rule':<24} {'B':>4} {'m':>3} {'static throughput':>24} {'latency':>24} {'full, every draft':>18} "
        f"{'full, budget':>15} {'verified':>9}"
    )
    for r in found:
        print(
            f"{r['rule']:<24} {r['batch']:>4} {r['m']:>3} "
            f"{r['throughput_speedup']:>6.2f}x [{r['throughput_speedup_lo']:.2f}, {r['throughput_speedup_hi']:.2f}]"
            f"{'':>4}{r['latency_speedup']:>6.2f}x [{r['latency_speedup_lo']:.2f}, {r['latency_speedup_hi']:.2f}]"
            f"{'':>4}{r['fixed_speedup']:>8.3f}x+-{r['fixed_speedup_se']:.3f} "
            f"{r['budget_speedup']:>7.3f}x+-{r['budget_speedup_se']:.3f} {r['verified']:>9.2f}"
        )


def run(args) -> int:
    from .._analysis._analyze import analyze_trace, parse_rules
    from .._analysis._batch import checked_batch_size
    from .._analysis._calibrations import cost_description, find_calibration_path
    from .._analysis._cost import CostModel, load_cost
    from .._analysis._outputs import write_outputs
    from .._analysis._plan import predict_speedup
    from .._laws._policies import AUTO_POLICIES, make_draft_policy

    # every argument is checked before the cost model is read, and the cost model before the work
    policies = []
    for spec in args.draft_policy or ():
        policies += list(AUTO_POLICIES) if spec == "auto" else [spec]
    for spec in policies:
        make_draft_policy(spec)
    _gate(args)
    for size in args.batch or ():
        try:
            checked_batch_size(size, "a batch size")
        except ValueError as exc:
            raise ValueError(f"--batch: {exc}") from None
    traces = None
    chosen, where = "given", None
    if args.cost:
        cost, where = load_cost(args.cost), f"in {args.cost}"
    elif args.cost_ratio is not None:
        cost = CostModel.from_ratio(args.cost_ratio)
    elif args.cost_profile is not None:
        cost = CostModel.from_profile(args.cost_profile)
    else:
        traces = _traces(args)
        found = find_calibration_path(traces)
        if found is not None:
            cost, chosen = load_cost(found), f"the newest calibration of the trace's model pair in the cache, {found}"
            where = f"in {found} (the newest calibration of the trace's model pair in the cache)"
        else:
            cost = CostModel.from_profile(DEFAULT_COST_PROFILE)
            chosen = (
                "the default: no calibration of the trace's model pair in the cache; 'cactus-theory calibrate' "
                "times this machine, --cost reads a cost file"
            )
    problems = cost.problems()
    if problems and not args.trust_cost:
        raise ValueError(
            f"the cost model{' ' + where if where else ''} cannot be trusted as it is: "
            + "; ".join(problems)
            + ". Re-measure it on an idle machine (cactus-theory calibrate, with "
            "the same models and --out that file), give another with --cost, or plan anyway with "
            "--trust-cost"
        )
    for size in args.batch or ():
        cost.at_batch(size)  # a batch size the cost model did not time is refused before the analysis
    _check_out(args, [*_trace_inputs(args), args.cost, args.quality, args.long_answers])
    traces = traces if traces is not None else _traces(args)
    if args.quality or args.long_answers:
        return _frontier(args, traces, cost)
    if args.max_loss is not None:
        raise ValueError("--max-loss is the accuracy budget of --quality RECORDS: give the records too, or drop it")
    given = [flag for flag in _given_flags(args) if flag in SAMPLING_FLAGS]
    if given:
        raise ValueError(
            f"{', '.join(given)}: the sampling of --quality's frontier (the records "
            "rescored under your engine's chain); a plan from a trace keeps the sampling the trace was dumped with: "
            "give --quality RECORDS, or drop them"
        )
    options = analysis_options(args, draft_policies=policies, cost=cost)
    result = analyze_trace(traces, parse_rules(args.rules, args.delta), progress=_progress(args), options=options)
    plan = predict_speedup(
        result,
        cost,
        max_kl=args.max_kl,
        allow_untrusted=args.trust_cost,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
    )
    ratio = plan.cost.draft_token / plan.cost.verify_block[1]
    print(_analysed(traces, result))
    print(f"cost: {cost_description(plan.cost, traces)}; draft / verifier token cost {ratio:.3f}")
    if chosen != "given":
        print(f"  ({chosen})")
    for line in [f"note: {note}" for note in plan.cost.notes()] + [f"warning: {w}" for w in plan.warnings]:
        print(line)
    for task in _tasks_to_show(plan.rows):
        print(f"\n{'all tasks' if task == 'all' else 'task ' + task}: predicted speedup at every m (* the best)")
        print(plan.table(task, every_m=True, warnings=False))
    if args.batch:
        _print_batches(args, result, cost)
    if args.out:
        from .._analysis._plotting import plot_plan
        from .._util._files import atomic_write
        from .._util._results import figure_png

        written = [atomic_write(os.path.join(args.out, "plan.csv"), plan.to_csv().encode())]
        written.append(atomic_write(os.path.join(args.out, "plan.json"), plan.to_json().encode()))
        written.append(atomic_write(os.path.join(args.out, "plan.png"), figure_png(plot_plan(plan))))
        written += write_outputs(result, args.out, figures=False)
        for path in written:
            print(f"wrote {path}")
    return 0


def _frontier(args, traces, cost) -> int:
    """``--quality RECORDS``: the deployment frontier and its recommendation (``deployment_frontier``)."""
    from .._analysis._analyze import parse_rules
    from .._analysis._frontier import MAX_LOSS, deployment_frontier
    from .._analysis._referee_summary import read_exact_records
    from ._common import _command_line, _settings

    if len(args.batch or ()) > 1:
        raise ValueError("--quality takes one --batch size (the concurrency deployed at); got several")
    if args.bootstrap == 0:
        raise ValueError(
            "--bootstrap 0 gives no intervals, and the frontier decides by the loss's upper 95% bound: give "
            "--bootstrap N with N >= 1 (default 1000)"
        )
    from .._analysis._referee_summary import read_records

    records = read_exact_records(args.quality) if args.quality else None
    long = read_records(args.long_answers) if args.long_answers else None
    frontier = deployment_frontier(
        traces,
        records,
        cost,
        long_answers=long,
        rules=parse_rules(args.rules, args.delta) if "--rules" in _given_flags(args) else None,
        ms=args.m,
        settings=_settings(args, records or long),
        max_loss=MAX_LOSS if args.max_loss is None else args.max_loss,
        batch=args.batch[0] if args.batch else None,
        n_boot=args.bootstrap,
        allow_untrusted=args.trust_cost,
        progress=_progress(args),
    )
    print(frontier.table())
    if args.out:
        for path in frontier.write(args.out, command=_command_line(args)):
            print(f"wrote {path}")
    return 0
