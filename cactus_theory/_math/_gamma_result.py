"""What ``exact_gamma(..., full_output=True)`` reports besides gamma (``GammaResult``, scipy's ``full_output``
style), read as every result is (``records``: one row per element; ``table``, printed by ``print``). It stands on
NumPy alone: the math wing imports nothing of the package."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GammaResult"]


@dataclass(frozen=True)
class GammaResult:
    """What ``exact_gamma(..., full_output=True)`` reports besides gamma (scipy style), read as every result is
    (``records``: one row per element; ``table``, also ``print``'s).

    Attributes
    ----------
    gamma : ndarray
        The root, shaped like the broadcast inputs.
    iterations : ndarray of int
        Solver iterations per element (0 where an edge case or a closed-form inverse decided gamma).
    converged : ndarray of bool
        Whether each element met the tolerance.
    method : str
        The method actually used: "closed-form inverse", "compiled KL kernel", "newton",
        "brentq" or "toms748" ("auto" resolves to one of the first three), always followed by
        the certification (compiled for KL, chi2 and squared Hellinger with numba).
    flag : str
        "converged" or a sentence naming how many elements did not converge.
    residual : ndarray
        B_f(gamma; q) - delta (<= 0: the budget is never overspent; -inf where delta = inf), in
        double-double for KL, chi2 and squared Hellinger with numba, else in long double; a tie
        closer than that evaluation's error reads 0.
    function_calls : ndarray of int
        Evaluations of B_f per element, solver and certification together.
    """

    gamma: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray
    method: str
    flag: str
    residual: np.ndarray | None = None
    function_calls: np.ndarray | None = None

    name = "gamma"

    @property
    def all_converged(self) -> bool:
        return bool(np.all(self.converged))

    def records(self) -> list:
        """One row per element: gamma, iterations, converged, the residual and the function calls."""
        columns = {"gamma": self.gamma, "iterations": self.iterations, "converged": self.converged}
        for key in ("residual", "function_calls"):
            if getattr(self, key) is not None:
                columns[key] = getattr(self, key)
        flat = {k: np.broadcast_to(np.asarray(v), np.shape(self.gamma)).ravel() for k, v in columns.items()}
        size = np.size(self.gamma)
        return [{k: v[i].item() for k, v in flat.items()} | {"method": self.method} for i in range(size)]

    def table(self) -> str:
        lines = [
            f"method: {self.method}; {self.flag}",
            f"{'gamma':>22} {'iterations':>10} {'converged':>9} {'residual':>12}",
        ]
        for r in self.records()[:20]:
            residual = f"{r['residual']:12.3e}" if "residual" in r else " " * 12
            lines.append(f"{r['gamma']:>22.17g} {r['iterations']:>10} {r['converged']!s:>9} {residual}")
        if np.size(self.gamma) > 20:
            lines.append(f"... ({np.size(self.gamma)} elements)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
