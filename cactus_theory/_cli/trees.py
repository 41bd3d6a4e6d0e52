"""``cactus-theory trees``: multi-draft and tree verification against the optimum.
Its arguments, then the code that runs them."""

from __future__ import annotations

from ._common import (
    _int_at_least,
    _ints,
    _run_study,
    _study_options,
)

ORDER = 10
HELP = "multi-draft and tree verification, each against the optimum of its own drafting scheme"


def add_arguments(tr):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    tr.add_argument("--k", type=_ints, default=[1, 2, 4, 8], help="drafts per position (tree widths)")
    tr.add_argument("--m", type=_ints, default=[4, 8], help="tree depths")
    tr.add_argument("--bins-k", type=_int_at_least(1), default=4, help="width of the per-bin tables")
    _study_options(tr, "multi_draft.md / .json / .csv / .png")
    tr.set_defaults(func=run)
    return tr


def run(args) -> int:
    from .._studies._trees import compare_multi_draft

    def show(result):
        for m in result.ms:
            print(result.table(m))
            print()

    return _run_study(
        args, compare_multi_draft, show, ks=tuple(args.k), ms=tuple(args.m), k_bins=args.bins_k, n_boot=args.bootstrap
    )
