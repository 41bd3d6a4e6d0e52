"""``cactus-theory block``: block verification against token-wise SpS and strict verification.
Its arguments, then the code that runs them."""

from __future__ import annotations

from ._common import (
    _int_at_least,
    _ints,
    _run_study,
    _study_options,
)

ORDER = 9
HELP = "block verification against token-wise SpS and strict verification, sampled and greedy drafting"


def add_arguments(bl):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    bl.add_argument("--m", type=_ints, default=[1, 2, 4, 8, 12, 16, 20], help="drafted tokens per verification")
    bl.add_argument(
        "--paths",
        type=_int_at_least(2),
        default=1024,
        help="Monte Carlo drafted paths per block start where the block rule's law is too large to enumerate",
    )
    _study_options(bl, "block_verification.md / .json / .csv / .png")
    bl.set_defaults(func=run)
    return bl


def run(args) -> int:
    from .._studies._block_study import compare_block_verification

    return _run_study(args, compare_block_verification, ms=tuple(args.m), n_boot=args.bootstrap, block_paths=args.paths)
