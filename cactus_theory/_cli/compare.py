"""``cactus-theory compare``: every registered rule at its declared settings.
Its arguments, then the code that runs them."""

from __future__ import annotations

import time

from ._common import (
    _check_out,
    _command_line,
    _int_at_least,
    _progress,
    _progress_options,
    _resamples,
    _trace_argument,
    _trace_inputs,
    _traces,
)

ORDER = 8
HELP = "every registered rule at its declared settings (the paper grid), each with its bonus policy, on a trace"


def add_arguments(cp):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    _trace_argument(cp)
    cp.add_argument("--out", default="rules_comparison", help="write rules_comparison.md / .json / .png here")
    cp.add_argument("--bootstrap", type=_resamples, default=1000, help="bootstrap resamples (0: no intervals)")
    cp.add_argument("--processes", type=_int_at_least(1), default=1, help="local worker processes over shards")
    _progress_options(cp)
    cp.set_defaults(func=run)
    return cp


def run(args) -> int:
    from .._studies._zoo import compare_rules, write_comparison

    _check_out(args, _trace_inputs(args))
    start = time.perf_counter()
    traces = _traces(args)
    comparison = compare_rules(traces, n_boot=args.bootstrap, processes=args.processes, progress=_progress(args))
    command = _command_line(args)
    label = ", ".join(args.trace) if args.trace else None
    paths = write_comparison(
        comparison, args.out, command=command, seconds=time.perf_counter() - start, trace_label=label
    )
    with open(paths[0], encoding="utf-8") as fh:
        print(fh.read())
    for path in paths:
        print(f"wrote {path}")
    return 0
