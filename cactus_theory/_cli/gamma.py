"""``cactus-theory gamma``: the exact and approximate Cactus bonus for one q(n) and delta.
Its arguments, then the code that runs them."""

from __future__ import annotations

import json

from .._math._divergences import available_divergences, binary_divergence, get_divergence
from .._math._gamma import APPROX_METHODS, approx_gamma, exact_gamma
from ._common import _budget, _probability

ORDER = 0
HELP = "exact and approximate Cactus bonus gamma for one q(n) and delta"


def add_arguments(g):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    g.add_argument(
        "--target-prob", type=_probability, required=True, help="verifier probability q(n) of the drafted token"
    )
    g.add_argument("--delta", type=_budget, required=True, help="divergence budget delta >= 0")
    g.add_argument("--divergence", default="kl", choices=available_divergences(), help="f-divergence")
    g.add_argument(
        "--draft-prob", type=_probability, default=None, help="draft probability p(n): also print min(1, gamma/p(n))"
    )
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g.set_defaults(func=run)
    return g


def _gamma_table(target_prob: float, delta: float, divergence: str, draft_prob: float | None):
    div = get_divergence(divergence)
    rows = [("exact", float(exact_gamma(target_prob, delta, div)))]
    for method in APPROX_METHODS:
        try:
            rows.append((method, float(approx_gamma(target_prob, delta, div, method=method))))
        except ValueError:  # a method this divergence does not support (e.g. no f''')
            continue
    table = []
    for method, gamma in rows:
        achieved = float(binary_divergence(gamma, target_prob, div))
        row = {
            "method": method,
            "gamma": gamma,
            "divergence": achieved,
            "within_delta": bool(achieved <= delta * (1 + 1e-12)),
        }
        if draft_prob is not None:
            row["acceptance"] = 1.0 if draft_prob == 0 else min(1.0, gamma / draft_prob)
        table.append(row)
    return table


def run(args) -> int:
    table = _gamma_table(args.target_prob, args.delta, args.divergence, args.draft_prob)
    if args.json:
        print(
            json.dumps(
                {
                    "target_prob": args.target_prob,
                    "delta": args.delta,
                    "divergence": args.divergence,
                    "draft_prob": args.draft_prob,
                    "rows": table,
                },
                indent=2,
            )
        )
        return 0
    div = get_divergence(args.divergence)
    print(
        f"Cactus bonus gamma for q(n) = {args.target_prob:g}, delta = {args.delta:g}, divergence {div.name} "
        f"({div.description})"
    )
    header = f"{'method':<8} {'gamma':>16} {'achieved D_f(h||q)':>20} {'<= delta':>9}"
    if args.draft_prob is not None:
        header += f" {'P(accept) p(n)=' + format(args.draft_prob, 'g'):>22}"
    print(header)
    for row in table:
        line = (
            f"{row['method']:<8} {row['gamma']:>16.12f} {row['divergence']:>20.12g} "
            f"{'yes' if row['within_delta'] else 'NO':>9}"
        )
        if "acceptance" in row:
            line += f" {row['acceptance']:>22.12f}"
        print(line)
    print(
        "exact: root of B_f(gamma; q) = delta on [q, 1] (clipped to 1); taylor: Corollary 5; safe: provably <= delta."
    )
    return 0
