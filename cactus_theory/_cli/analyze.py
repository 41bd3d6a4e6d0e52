"""``cactus-theory analyze``: acceptance, AL and emitted drift of rules on traces.
Its arguments, then the code that runs them."""

from __future__ import annotations

import sys

from ._common import (
    _analysed,
    _bonus_policy_option,
    _check_out,
    _delta_help,
    _draft_mode_option,
    _floats,
    _gate_option,
    _int_at_least,
    _ints,
    _progress,
    _progress_options,
    _resamples,
    _rules_epilog,
    _rules_option,
    _tasks_to_show,
    _trace_argument,
    _trace_inputs,
    _traces,
    analysis_options,
)

ORDER = 3
HELP = "acceptance, AL and emitted drift of rules on a trace"
EPILOG = _rules_epilog


def add_arguments(a):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    _trace_argument(a, "trace directories or glob patterns, analysed as one set (default: the embedded trace)")
    _rules_option(a)
    a.add_argument("--delta", type=_floats, default=[0.25, 0.5, 1.0, 2.0], help=_delta_help())
    a.add_argument("--m", type=_ints, default=[4, 8, 20], help="drafted tokens per verification")
    a.add_argument("--task", action="append", default=None, help="analyse only this task (repeatable)")
    a.add_argument(
        "--temperature", type=float, default=None, help="override the trace's sampling settings (with --top-k/--top-p)"
    )
    a.add_argument("--top-k", type=_int_at_least(0), default=20, help="top-k with --temperature")
    a.add_argument("--top-p", type=float, default=0.95, help="top-p with --temperature")
    a.add_argument(
        "--bootstrap", type=_resamples, default=1000, help="bootstrap resamples for the 95%% intervals (0: none)"
    )
    a.add_argument("--processes", type=_int_at_least(1), default=1, help="local worker processes over shards")
    engine = a.add_mutually_exclusive_group()
    engine.add_argument(
        "--scheduler", default=None, metavar="ADDRESS", help="run the shards on this Dask scheduler (tcp://HOST:PORT)"
    )
    engine.add_argument(
        "--workers", type=_int_at_least(1), default=None, help="run the shards on a local Dask cluster of N workers"
    )
    a.add_argument("--out", default=None, help="write analysis.csv, analysis.json and figures here")
    a.add_argument("--no-figures", action="store_true", help="with --out: tables only")
    _bonus_policy_option(a)
    _draft_mode_option(a)
    _gate_option(a)
    _progress_options(a)
    a.set_defaults(func=run)
    return a


def _dask_client(args):
    """(client, cluster) for --scheduler / --workers, or (None, None)."""
    if args.scheduler is None and args.workers is None:
        return None, None
    if args.processes > 1:
        raise ValueError("--processes runs local worker processes: give it or --scheduler / --workers, not both")
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ImportError("--scheduler and --workers need Dask: pip install 'cactus_theory[distributed]'") from None
    from .._analysis._engines import connect_scheduler, local_dask_cluster

    if args.scheduler is not None:
        return connect_scheduler(args.scheduler), None
    return local_dask_cluster(args.workers)


def run(args) -> int:
    from .._analysis._analyze import analyze_trace, parse_rules
    from .._analysis._outputs import write_outputs

    _check_out(args, _trace_inputs(args))
    traces = _traces(args)
    rules = parse_rules(args.rules, args.delta)
    options = analysis_options(args)
    from .._analysis._engines import close_quietly
    from .._util._files import Terminated, termination_as_exception, termination_deferred

    # a SIGTERM or SIGHUP while the cluster starts is held until it is up, then stops it whole (no worker left, no
    # half-started cluster's tracebacks)
    with termination_deferred() as held:
        client, cluster = _dask_client(args)
    # the workers this command started stop with it: a normal end, an error, Ctrl-C, SIGTERM or SIGHUP
    with termination_as_exception():
        try:
            if held:
                raise Terminated(128 + held[0])
            result = analyze_trace(traces, rules, progress=_progress(args), client=client, options=options)
        finally:
            close_quietly(client, cluster)
            if cluster is not None and sys.exc_info()[0] is not None:
                print(f"stopped the local Dask cluster ({args.workers} workers)", file=sys.stderr, flush=True)
    where = traces.directory if len(traces.traces) == 1 else f"{len(traces.traces)} traces ({traces.directory})"
    drafts = "" if args.draft_mode == "sampled" else "; greedy drafting (argmax p, one-hot for the rules)"
    print(f"trace {where}: {_analysed(traces, result)}; settings {result.settings}{drafts}")
    if result.empty_sequences:
        print(f"{result.empty_sequences} sequence(s) without positions left out")
    for note in result.notes:
        print(f"note: {note}")
    if any(r["sequences"] < 2 for r in result.rows):
        print("a 95% interval needs at least two sequences: rows over one sequence have none")
    for task in _tasks_to_show(result.rows):
        label = "all tasks" if task == "all" else f"task {task}"
        positions = next(r["positions"] for r in result.rows if r["task"] == task)
        print(f"\n{label} ({positions} positions)")
        print(result.table(task))
    for name in result.traces if result.trace_rows else []:
        positions = next((r["positions"] for r in result.trace_rows if r["trace"] == name), None)
        if positions is None:  # none of its sequences is of the tasks asked for
            continue
        print(f"\ntrace {name} ({positions} positions)")
        print(result.table(trace=name))
    print("\nthe columns:\n" + result.legend())
    if args.out:
        for path in write_outputs(result, args.out, figures=not args.no_figures):
            print(f"wrote {path}")
    return 0
