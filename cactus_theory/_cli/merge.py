"""``cactus-theory merge``: merge the parts of a split dump.
Its arguments, then the code that runs them."""

from __future__ import annotations

from .._util._files import check_output
from ._common import _progress, _progress_options

ORDER = 7
HELP = "merge the parts of a split dump (dump --part I/N) into one trace"


def add_arguments(mg):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    mg.add_argument("parts", nargs="+", help="the parts' trace directories or glob patterns")
    mg.add_argument(
        "--out",
        required=True,
        help="the merged trace: a new directory, never one of the parts (a rerun with the same parts resumes)",
    )
    mg.add_argument(
        "--allow-partial",
        action="store_true",
        help="merge an incomplete split (missing parts, parts of different splits, whole dumps), marked partial",
    )
    _progress_options(mg)
    mg.set_defaults(func=run)
    return mg


def run(args) -> int:
    from .._data._traceset import merge_traces

    check_output(args.out)  # merge_traces refuses an output that is (inside) a part
    trace = merge_traces(args.out, args.parts, progress=_progress(args), allow_partial=args.allow_partial)
    partial = trace.metadata.get("partial")
    note = f" (partial: {partial['reason']})" if partial else ""
    print(f"merged {len(trace)} sequences, {trace.n_positions} positions into {args.out}{note}")
    return 0
