"""``cactus-theory trees``: multi-draft and tree verification against the optimum.
Its arguments, then the code that runs them."""

from __future__ import annotations

from ._common import (
    _check_out,
    _command_line,
    _Formatter,
    _int_at_least,
    _ints,
    _progress,
    _progress_options,
    _resamples,
    _trace_inputs,
    _traces,
)

ORDER = 10


def add_parser(sub):
    """The subparser of this command."""
    tr = sub.add_parser(
        "trees",
        help="multi-draft and tree verification against the optimum of each drafting scheme",
        formatter_class=_Formatter,
    )
    tr.add_argument("trace", nargs="*", default=None, help="trace directories or globs (default: the embedded trace)")
    tr.add_argument("--k", type=_ints, default=[1, 2, 4, 8], help="drafts per position (tree widths)")
    tr.add_argument("--m", type=_ints, default=[4, 8], help="tree depths")
    tr.add_argument("--bins-k", type=_int_at_least(1), default=4, help="width of the per-bin tables")
    tr.add_argument("--bootstrap", type=_resamples, default=1000, help="bootstrap resamples (0: no intervals)")
    tr.add_argument("--out", default=None, help="write multi_draft.md / .json / .csv / .png here")
    _progress_options(tr)
    tr.set_defaults(func=run)
    return tr


def run(args) -> int:
    from .._studies._trees import compare_multi_draft

    _check_out(args, _trace_inputs(args))
    result = compare_multi_draft(_traces(args), ks=tuple(args.k), ms=tuple(args.m), k_bins=args.bins_k,
                                 n_boot=args.bootstrap, progress=_progress(args))  # fmt: skip
    for m in result.ms:
        print(result.table(m))
        print()
    if args.out:
        for path in result.write(args.out, command=_command_line(args)):
            print(f"wrote {path}")
    return 0
