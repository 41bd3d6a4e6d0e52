"""``cactus-theory report``: the main job, a report with figures.
Its arguments, then the code that runs them."""

from __future__ import annotations

import os
import time

from ._common import _check_out, _progress, _progress_options

ORDER = 11
HELP = "the main job: a report from the embedded trace and a synthetic suite"


def add_arguments(r):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    r.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    r.add_argument("--out", default="cactus_report", help="output directory")
    r.add_argument("--profile", action="store_true", help="print the seconds of each section (also in report.md)")
    _progress_options(r)
    r.set_defaults(func=run)
    return r


def run(args) -> int:
    from .._studies._report import build_report

    _check_out(args, [args.trace])
    timings = []
    start = time.perf_counter()
    table = build_report(args.out, trace=args.trace, progress=_progress(args), timings=timings)
    print(table)
    if args.profile:
        print("\nwhere the time went:")
        for name, seconds in timings:
            print(f"  {seconds:7.1f} s  {name}")
        print(f"  {time.perf_counter() - start:7.1f} s  total")
    print(f"report written to {os.path.join(args.out, 'report.md')} and report.html")
    return 0
