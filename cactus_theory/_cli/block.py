"""``cactus-theory block``: block verification against token-wise SpS and strict verification.
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

ORDER = 9


def add_parser(sub):
    """The subparser of this command."""
    bl = sub.add_parser(
        "block",
        help="block verification against token-wise SpS and strict verification, sampled and greedy drafting",
        formatter_class=_Formatter,
    )
    bl.add_argument("trace", nargs="*", default=None, help="trace directories or globs (default: the embedded trace)")
    bl.add_argument("--m", type=_ints, default=[1, 2, 4, 8, 12, 16, 20], help="drafted tokens per verification")
    bl.add_argument("--bootstrap", type=_resamples, default=1000, help="bootstrap resamples (0: no intervals)")
    bl.add_argument(
        "--paths",
        type=_int_at_least(2),
        default=1024,
        help="Monte Carlo drafted paths per block start where the block rule's law is too large to enumerate",
    )
    bl.add_argument("--out", default=None, help="write block_verification.md / .json / .csv / .png here")
    _progress_options(bl)
    bl.set_defaults(func=run)
    return bl


def run(args) -> int:
    from .._studies._block_study import compare_block_verification

    _check_out(args, _trace_inputs(args))
    result = compare_block_verification(_traces(args), tuple(args.m), n_boot=args.bootstrap, block_paths=args.paths,
                                        progress=_progress(args))  # fmt: skip
    print(result.table())
    if args.out:
        for path in result.write(args.out, command=_command_line(args)):
            print(f"wrote {path}")
    return 0
