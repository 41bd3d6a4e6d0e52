"""Symbolic derivations with SymPy: the Taylor expansion of B_f around gamma = q and the
closed-form bonus it implies, for any generator f.

With d = gamma - q, the two-point divergence expands as (our derivation, from Theorem 2 of Hao & Mou, ICLR 2026)

    B_f(q + d; q) = sum_{k>=2} c_k d^k,   c_k = f^(k)(1)/k! (q^(1-k) + (-1)^k (1-q)^(1-k)),

so c_2 = f''(1) / (2 q (1 - q)). Reverting the series in s = sqrt(delta) gives
gamma = q + s / sqrt(c_2) - c_3 delta / (2 c_2^2) + O(delta^(3/2)); order 2 is the paper's
Corollary 5. Every expression here is derived by SymPy from f itself, not typed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import sympy as sp

from ._generators import GENERATORS

__all__ = ["SYMPY_GENERATORS", "GeneratorFacts", "SymbolicGamma", "generator_facts", "symbolic_gamma"]

_t = sp.Symbol("t", positive=True)


def _sympy_generators() -> dict:
    """{name: SymPy f(t)} of every registered divergence that carries a generator
    (``FDivergence.sympy_generator``, recorded in ``_generators``; TV's kinked f has none)."""
    return {name: sp.sympify(text, locals={"t": _t}) for name, text in sorted(GENERATORS.items())}


#: SymPy generators f(t) of the registered divergences, from their own declarations (same
#: conventions as ``get_divergence``).
SYMPY_GENERATORS = _sympy_generators()


def _as_expr(f, t=None):
    """(expr, t) from a SymPy expression, a string in t, or a built-in name."""
    if isinstance(f, str):
        known = _sympy_generators()  # registered since this module was imported too
        if f in known:
            return known[f], _t
    if isinstance(f, str):
        t = t if t is not None else _t
        try:
            expr = sp.sympify(f, locals={str(t): t})
        except (sp.SympifyError, SyntaxError, TypeError) as exc:
            raise ValueError(f"f must be a SymPy expression in t (e.g. 't*log(t)'); could not parse {f!r}") from exc
    elif isinstance(f, sp.Expr):
        expr = f
    else:
        raise ValueError(
            f"f must be a SymPy expression, a string in t, or one of {sorted(SYMPY_GENERATORS)}; got {f!r}"
        )
    if t is None:
        free = sorted(expr.free_symbols, key=str)
        if len(free) != 1:
            raise ValueError(f"f must have exactly one free symbol (the ratio t); {expr} has {free}: pass t=")
        t = free[0]
    if t not in expr.free_symbols:
        raise ValueError(f"f = {expr} does not depend on t = {t}")
    # Work with a positive symbol so that sqrt / log simplify as for real ratios t > 0.
    tp = sp.Symbol(str(t), positive=True)
    return expr.subs(t, tp), tp


@dataclass(frozen=True)
class GeneratorFacts:
    """What a numerical FDivergence needs, derived from a SymPy generator."""

    expr: sp.Expr
    t: sp.Symbol
    f: Callable = field(repr=False)
    f_prime: Callable = field(repr=False)
    f_second_at_one: float
    f_third_at_one: float
    slope_at_infinity: float


def generator_facts(f, t=None) -> GeneratorFacts:
    """f, f', f''(1), f'''(1) and lim_{t->inf} f(t)/t of a generator, derived symbolically.

    Examples
    --------
    >>> facts = generator_facts("t*log(t)")
    >>> facts.f_second_at_one, facts.f_third_at_one, facts.slope_at_infinity
    (1.0, -1.0, inf)
    """
    expr, t = _as_expr(f, t)
    f1 = sp.simplify(expr.subs(t, 1))
    if f1 != 0:
        expr = expr - f1  # D_f is unchanged between distributions up to the constant f(1)
    d1 = sp.diff(expr, t)
    f2 = float(sp.diff(expr, t, 2).subs(t, 1))
    f3 = float(sp.diff(expr, t, 3).subs(t, 1))
    slope = float(sp.limit(expr / t, t, sp.oo))
    return GeneratorFacts(
        expr=expr,
        t=t,
        f=sp.lambdify(t, expr, "numpy"),
        f_prime=sp.lambdify(t, d1, "numpy"),
        f_second_at_one=f2,
        f_third_at_one=f3,
        slope_at_infinity=slope,
    )


@dataclass(frozen=True)
class SymbolicGamma:
    """A closed-form bonus gamma(q, delta) derived from f by series reversion.

    Attributes
    ----------
    expr : sympy.Expr
        gamma as an expression in ``q`` and ``delta`` (unclipped).
    q, delta : sympy.Symbol
    order : int
        Order of the expansion of B_f in d = gamma - q (2: Corollary 5).
    coefficients : tuple of sympy.Expr
        c_2, ..., c_order of B_f(q + d; q) = sum c_k d^k.
    func : callable
        ``func(q, delta)``, vectorised with NumPy, clipped to [q, 1].
    """

    expr: sp.Expr
    q: sp.Symbol
    delta: sp.Symbol
    order: int
    coefficients: tuple
    func: Callable = field(repr=False)

    @property
    def latex(self) -> str:
        return sp.latex(self.expr)


def symbolic_gamma(f, order: int = 2, t=None) -> SymbolicGamma:
    """Derive gamma = q + d(delta) from the order-``order`` expansion of B_f around gamma = q.

    ``f`` is a SymPy expression of the generator, a string in ``t``, or a built-in name
    ("kl", "reverse_kl", "chi2", "hellinger", "js"; total variation has no Taylor expansion).

    Examples
    --------
    >>> sg = symbolic_gamma("kl")
    >>> sg.expr
    sqrt(2)*sqrt(delta)*sqrt(q)*sqrt(1 - q) + q
    >>> round(float(sg.func(0.3, 1.0)), 12)
    0.948074069841
    """
    import numpy as np

    if order not in (2, 3, 4, 5):
        raise ValueError(f"order must be 2, 3, 4 or 5; got {order!r}")
    expr, t = _as_expr(f, t)
    q = sp.Symbol("q", positive=True)
    delta = sp.Symbol("delta", positive=True)
    d = sp.Symbol("d", positive=True)
    s = sp.Symbol("s", positive=True)  # s = sqrt(delta)
    r = sp.Symbol("r", positive=True)  # r = 1 - q, positive so that sqrt(q r) splits
    binary = q * expr.subs(t, 1 + d / q) + r * expr.subs(t, 1 - d / r) - expr.subs(t, 1)
    series = sp.series(binary, d, 0, order + 1).removeO()
    coeffs = [sp.factor(sp.simplify(series.coeff(d, k))) for k in range(order + 1)]
    if any(sp.simplify(c) != 0 for c in coeffs[:2]):
        raise ValueError(f"f = {expr} is not a generator with f(1) = 0 and a minimum at 1")
    if sp.simplify(coeffs[2]) == 0:
        raise ValueError(f"f = {expr} has f''(1) = 0: no second-order expansion (use the exact solver)")
    # Series reversion: d = sum_j a_j s^j with sum_k c_k d^k = s^2 order by order.
    a = sp.symbols(f"a1:{order}")
    d_of_s = sum(a[j] * s ** (j + 1) for j in range(order - 1))
    lhs = sp.expand(sum(coeffs[k] * d_of_s**k for k in range(2, order + 1)))
    solution = {a[0]: 1 / sp.sqrt(coeffs[2])}
    for j in range(1, order - 1):
        eq = lhs.coeff(s, j + 2).subs(solution)
        solution[a[j]] = sp.factor(sp.simplify(sp.solve(eq, a[j])[0]))
    increment = sum(solution[a[j]].subs(r, 1 - q) * sp.sqrt(delta) ** (j + 1) for j in range(order - 1))
    coeffs = [c.subs(r, 1 - q) for c in coeffs]
    gamma_expr = q + increment
    raw = sp.lambdify((q, delta), gamma_expr, "numpy")

    def func(target_prob, delta_value, _raw=raw):
        qv = np.asarray(target_prob, dtype=np.float64)
        with np.errstate(all="ignore"):
            g = np.asarray(_raw(qv, np.asarray(delta_value, dtype=np.float64)), dtype=np.float64)
        g = np.clip(np.where(np.isnan(g), qv, g), qv, 1.0)
        return g[()] if g.ndim == 0 else g

    return SymbolicGamma(expr=gamma_expr, q=q, delta=delta, order=order, coefficients=tuple(coeffs[2:]), func=func)
