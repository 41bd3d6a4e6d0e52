"""f-divergences: generators, their exact two-point ("binary") form and full-distribution form.

An f-divergence between distributions h and q over one vocabulary is

    D_f(h || q) = sum_x q(x) f(h(x) / q(x)),       f convex, f(1) = 0,

with the perspective conventions 0 f(0/0) = 0 and 0 f(a/0) = a lim_{t->inf} f(t)/t.
Because Cactus scales every token but the drafted one by a single factor, its divergence
collapses to the binary divergence between Bernoulli(gamma) and Bernoulli(q(n)):

    B_f(gamma; q) = q f(gamma/q) + (1 - q) f((1 - gamma)/(1 - q)).

The built-in divergences evaluate each term b f(a/b) in a cancellation-free form, so
``binary_divergence`` has a relative error of a few ulp even when gamma is within 1e-8 of q,
and is exact at the edges q in {0, 1} and gamma in {0, 1}.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from . import _generators
from ._validation import as_probability, broadcast, check_distribution

__all__ = [
    "FDivergence",
    "available_divergences",
    "binary_divergence",
    "divergence",
    "get_divergence",
    "register_divergence",
]

_EPS = np.finfo(np.float64).eps

# Coefficients of h(u) = (1+u) log(1+u) - u = sum_{k>=2} (-1)^k u^k / (k (k-1)), divided by u^2,
# in Horner order (highest power first). 20 terms: |u| < 0.1 leaves a truncation error < 1e-20
# relative, below long double's resolution (the certification of exact_gamma evaluates in it).
_H_COEFFS = {
    np.dtype(dt): np.array([dt(1) / ((j + 2) * (j + 1)) * (-1) ** j for j in range(20)][::-1], dtype=dt)
    for dt in (np.float64, np.longdouble)
}
_SERIES_RADIUS = 0.1


def _as_float_pair(a, b):
    return np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))


def _log_ratio(a, b):
    """log(a / b) for a, b > 0 without forming a / b (which may overflow or underflow)."""
    return np.log(a) - np.log(b)


def _finish(out):
    return out[()] if out.ndim == 0 else out


# Each perspective takes (a, b, d) with d = a - b supplied by the caller, so that a difference
# known exactly (the solver's increment gamma - q) is never recomputed from rounded a and b.
# The built-in ones are written for any floating dtype: float64, and long double for the
# certification step of exact_gamma.
def _kl_perspective(a, b, d):
    """a log(a/b) - a + b >= 0, with 0 log 0 = 0 and a log(a/0) = inf; accurate when a ~ b.

    Each branch is evaluated only where it applies (the 20-term series dominates the cost).
    """
    a, b, d = np.broadcast_arrays(a, b, d)
    with np.errstate(all="ignore"):
        u = d / b
        out = np.empty(u.shape, dtype=u.dtype)
        near = np.abs(u) < _SERIES_RADIUS
        un = u[near]
        out[near] = b[near] * un * un * np.polyval(_H_COEFFS.get(u.dtype, _H_COEFFS[np.dtype(np.float64)]), un)
        # log1p(d/b) keeps digits for moderate u; log a - log b survives a/b overflowing
        # (subnormal b); a log(a/b) is right when a << b, where the caller's d may be -b rounded.
        mid = ~near & (u > -0.5) & (u <= 1.0)
        out[mid] = a[mid] * np.log1p(u[mid]) - d[mid]
        far = ~near & ~mid
        af, bf = a[far], b[far]
        out[far] = np.where(af > 0, af * _log_ratio(af, bf), 0.0) - d[far]
    out = np.where(a == 0, b, out)
    out = np.where(b == 0, np.where(a > 0, np.inf, 0.0), out)
    return out


def _reverse_kl_perspective(a, b, d):
    return _kl_perspective(b, a, -d)


def _chi2_perspective(a, b, d):
    with np.errstate(all="ignore"):
        # d^2 / b, ordered so that no intermediate underflows (d ~ 1e-162) or overflows (b ~ 1e-308)
        out = np.where(np.abs(d) > 1e-150, d * d / b, (d / b) * d)
    return np.where(b == 0, np.where(a > 0, np.inf, 0.0), out)


def _hellinger_perspective(a, b, d):
    with np.errstate(all="ignore"):
        out = (d / (np.sqrt(a) + np.sqrt(b))) ** 2
    return np.where((a == 0) & (b == 0), 0.0, out)


def _tv_perspective(a, b, d):
    return 0.5 * np.abs(d) + 0.0 * (a + b)


def _js_perspective(a, b, d):
    # Homogeneous of degree 1: evaluate at scale 1 so that the midpoint cannot underflow to 0.
    with np.errstate(all="ignore"):
        s = np.maximum(a, b)
        safe = np.where(s > 0, s, 1.0)
        a1, b1, d1 = a / safe, b / safe, d / safe
        m = 0.5 * (a1 + b1)
        out = 0.5 * s * (_kl_perspective(a1, m, 0.5 * d1) + _kl_perspective(b1, m, -0.5 * d1))
    return np.where(s > 0, out, 0.0)


# d/dgamma B_f(q + d; q) for d in [0, 1 - q), written without cancellation.
def _kl_dgamma(q, d):
    with np.errstate(all="ignore"):
        u = d / q
        up = np.where(u > 1.0, np.log(q + d) - np.log(q), np.log1p(u))  # d/q may overflow
        return up - np.log1p(-d / (1 - q))


def _reverse_kl_dgamma(q, d):
    with np.errstate(all="ignore"):
        return d / ((q + d) * ((1 - q) - d))


def _chi2_dgamma(q, d):
    with np.errstate(all="ignore"):
        return 2 * (d / q) / (1 - q)


def _hellinger_dgamma(q, d):
    with np.errstate(all="ignore"):
        g, r = q + d, (1 - q) - d
        return (d / g) / (1 + np.sqrt(q / g)) + (d / r) / (1 + np.sqrt((1 - q) / r))


def _tv_dgamma(q, d):
    return np.ones(np.broadcast_shapes(np.shape(q), np.shape(d)))


def _js_dgamma(q, d):
    with np.errstate(all="ignore"):
        return 0.5 * (np.log1p(d / (2 * q + d)) - np.log1p(-d / (2 * (1 - q) - d)))


# Provably conservative closed forms: a bound D_f <= phi(chi^2) between two-point distributions,
# solved for gamma - q = sqrt(chi2 budget) sqrt(q) sqrt(1 - q) (three factors: a few ulp of
# error, no overflow for huge delta, no underflow for subnormal q). The rounding guard that
# makes the float result safe is in approx_gamma(method="safe").
def _sqrt_expm1(delta):
    with np.errstate(all="ignore"):
        return np.where(delta < 700.0, np.sqrt(np.expm1(np.minimum(delta, 700.0))), np.exp(0.5 * delta))


def _safe_from_chi2(sqrt_chi2_budget):
    def safe(q, delta):
        with np.errstate(all="ignore"):
            inc = sqrt_chi2_budget(delta) * np.sqrt(q) * np.sqrt(1 - q)
        return np.where(q * (1 - q) == 0, 0.0, inc)

    return safe


def _reverse_kl_safe(q, delta):
    # KL(q || h) <= log(1 + chi2(q || h)) and chi2(q || h) = (gamma - q)^2 / (gamma (1 - gamma)):
    # the larger root of (1 + c) gamma^2 - (2q + c) gamma + q^2 = 0 with c = expm1(delta), i.e.
    # gamma - q = (c (1/2 - q) + sqrt(c) sqrt(c + 4 q (1 - q)) / 2) / (1 + c), free of overflow
    # and of cancellation; c = inf (delta > 709) leaves a gap to 1 below float resolution.
    # Where the root passes the midpoint of [q, 1], the gap to 1 is taken instead: u = 1 - gamma =
    # 2 (1 - q)^2 / (2 + c - 2q + sqrt(c) sqrt(c + 4 q (1 - q))), each operation monotone in c, so
    # (1 - q) - u never decreases as delta grows (the first form's rounding near 1 did, by an ulp);
    # the first form is clamped below the same midpoint, so the switch never steps down.
    with np.errstate(all="ignore"):
        c = np.expm1(delta)
        root = np.sqrt(c) * np.sqrt(c + 4 * q * (1 - q))
        inc = (c * (0.5 - q) + 0.5 * root) / (1 + c)
        rest = 1 - q
        half = 0.5 * rest
        gap = 2 * rest * rest / ((2 + c - 2 * q) + root)
        inc = np.where(gap <= half, rest - gap, np.minimum(inc, rest - half))
        return np.where(np.isinf(c), rest, np.maximum(inc, 0.0))


def _hellinger_inverse(q, delta):
    # With gamma = sin^2 a and q = sin^2 b, B_H = 2 - 2 cos(a - b) = 4 sin^2((a - b) / 2), so
    # a = b + 2 phi with phi = arcsin(sqrt(delta) / 2), and gamma - q = sin(a - b) sin(a + b)
    # = sin(2 phi) sin(2 b + 2 phi) without cancellation. b = atan2(sqrt q, sqrt(1 - q)) is
    # accurate at both ends; a >= pi / 2 means the budget covers gamma = 1.
    with np.errstate(all="ignore"):
        b = np.arctan2(np.sqrt(q), np.sqrt(1.0 - q))
        phi = np.arcsin(np.minimum(0.5 * np.sqrt(delta), 1.0))
        inc = np.sin(2.0 * phi) * np.sin(2.0 * (b + phi))
        return np.where(b + 2.0 * phi >= 0.5 * np.pi, np.inf, inc)


def _chi2_inverse(q, delta):
    # B_chi2 = (gamma - q)^2 / (q (1 - q)): three square roots, no overflow or underflow.
    with np.errstate(all="ignore"):
        return np.where(q == 0, 0.0, np.sqrt(delta) * np.sqrt(q) * np.sqrt(1.0 - q))


@dataclass(frozen=True)
class FDivergence:
    """An f-divergence D_f(h || q) = sum_x q(x) f(h(x)/q(x)) with what the gamma solvers need.

    Parameters
    ----------
    name : str
        Registry name (lower case).
    f : callable
        The generator f(t), vectorised over NumPy arrays; convex with f(1) = 0.
    f_second_at_one : float or None
        f''(1), which sets the Taylor bonus (Corollary 5). None where f is not twice
        differentiable at 1 (total variation); then ``kink`` = f'(1+) - f'(1-) must be > 0.
    f_third_at_one : float or None
        f'''(1), used by the third-order closed form.
    perspective_fn : callable (a, b, d) -> b f(a/b) with d = a - b, or None
        Exact, edge-aware perspective; None derives one from ``f`` and ``slope_at_infinity``.
    binary_derivative : callable (gamma, q) -> dB/dgamma, or None
        Used by the vectorised Newton solver; None falls back to safeguarded secant steps.
    safe_increment_fn : callable (q, delta) -> gamma - q, or None
        A closed form that provably keeps B_f(gamma; q) <= delta (see ``approx_gamma``).
    inverse_increment_fn : callable (q, delta) -> gamma* - q, or None
        The exact inverse of B_f in closed form, where one exists (chi2, squared Hellinger,
        TV): ``exact_gamma`` then evaluates it instead of iterating. May exceed 1 - q (the
        caller caps it); exact up to a few ulp of rounding.
    slope_at_infinity : float
        lim_{t->inf} f(t)/t, used for 0 f(a/0) = a * slope (KL: inf).
    kink : float
        f'(1+) - f'(1-); nonzero only for divergences not differentiable at 1.
    f_prime : callable or None
        f'(t), vectorised: bounds the rounding error of a generator evaluated as written (the
        certification step of ``exact_gamma``); None estimates it by central differences.

    The generator is checked when the divergence is built: f(1) = 0, finite and convex on a
    grid of (0, inf) (1e-4 .. 1e4); a ValueError says which check failed.
    """

    name: str
    f: Callable = field(repr=False)
    f_second_at_one: float | None
    f_third_at_one: float | None = None
    perspective_fn: Callable | None = field(default=None, repr=False)
    binary_derivative_fn: Callable | None = field(default=None, repr=False)
    safe_increment_fn: Callable | None = field(default=None, repr=False)
    inverse_increment_fn: Callable | None = field(default=None, repr=False)
    slope_at_infinity: float = math.inf
    kink: float = 0.0
    description: str = ""
    f_prime: Callable | None = field(default=None, repr=False)
    #: The generator f(t) as SymPy reads it (a string in t, e.g. "t*log(t)"; None for a kinked f such
    #: as TV's): the symbolic derivations (``symbolic_gamma``, docs: Theory) start from it.
    sympy_generator: str | None = field(default=None, repr=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string; got {self.name!r}")
        if self.f_second_at_one is None:
            if not self.kink > 0:
                raise ValueError(
                    f"divergence {self.name!r}: give f_second_at_one (f''(1) > 0) or, for an f with a "
                    f"kink at 1, kink = f'(1+) - f'(1-) > 0"
                )
        elif not (np.isfinite(self.f_second_at_one) and self.f_second_at_one > 0):
            raise ValueError(
                f"divergence {self.name!r}: f_second_at_one must be a finite number > 0 (f strictly "
                f"convex at 1); got {self.f_second_at_one!r}"
            )
        _check_generator(self.name, self.f)

    # -- evaluation -------------------------------------------------------------------------
    def perspective(self, a, b, d=None):
        """b f(a/b) with 0 f(0/0) = 0 and 0 f(a/0) = a * slope_at_infinity; ``d`` = a - b if known exactly."""
        a, b = _as_float_pair(a, b)
        d = a - b if d is None else np.broadcast_to(np.asarray(d, dtype=np.float64), a.shape)
        if self.perspective_fn is not None:
            return _finish(np.asarray(self.perspective_fn(a, b, d), dtype=np.float64))
        f1 = float(self.f(np.float64(1.0)))
        with np.errstate(all="ignore"):
            out = b * (np.asarray(self.f(1.0 + d / np.where(b > 0, b, 1.0)), dtype=np.float64) - f1)
            zero_b = np.where(a > 0, a * self.slope_at_infinity, 0.0)
        return _finish(np.where(b > 0, out, zero_b))

    def binary_increment(self, increment, target_prob):
        """B_f(q + d; q) from the increment d = gamma - q, without recomputing d from gamma."""
        d, q = _as_float_pair(increment, target_prob)
        r = 1.0 - q
        return self.perspective(q + d, q, d) + self.perspective(r - d, r, -d)

    def binary_increment_precise(self, increment, target_prob):
        """B_f(q + d; q) in long double for the built-in perspective forms (None for a generator
        evaluated as written): the certification step of ``exact_gamma`` decides B_f <= delta
        with it. Relative error a few hundred long-double ulp at most (tested at 50 digits)."""
        if self.perspective_fn is None:
            return None
        d = np.asarray(increment, dtype=np.longdouble)
        q = np.asarray(target_prob, dtype=np.longdouble)
        d, q = np.broadcast_arrays(d, q)
        r = 1 - q
        with np.errstate(all="ignore"):
            return self.perspective_fn(q + d, q, d) + self.perspective_fn(r - d, r, -d)

    def rounding_bound(self, increment, target_prob):
        """An upper bound of the rounding error of ``binary_increment`` for a generator evaluated
        as written: 64 eps (a abs(f'(a/b)) + abs(b f(a/b))) summed over its two terms (float64)."""
        d, q = _as_float_pair(increment, target_prob)
        total = np.zeros(d.shape)
        with np.errstate(all="ignore"):
            for a, b in ((q + d, q), ((1.0 - q) - d, 1.0 - q)):
                t = a / np.where(b > 0, b, 1.0)
                if self.f_prime is not None:
                    slope = np.abs(np.asarray(self.f_prime(t), dtype=np.float64))
                else:
                    h = 1e-6 * np.maximum(t, 1e-6)
                    slope = np.abs((np.asarray(self.f(t + h)) - np.asarray(self.f(np.maximum(t - h, 0.0)))) / (2 * h))
                value = np.abs(np.asarray(self.f(t), dtype=np.float64))
                term = np.where(b > 0, a * slope + b * value, np.abs(a * self.slope_at_infinity))
                total += np.where(np.isfinite(term), term, np.inf)
        return 64 * _EPS * total

    def binary(self, gamma, target_prob):
        """B_f(gamma; q) = q f(gamma/q) + (1 - q) f((1 - gamma)/(1 - q)); no input checks."""
        g, q = _as_float_pair(gamma, target_prob)
        d = g - q  # passed alongside gamma, never used to rebuild it (gamma << q would round away)
        return self.perspective(g, q, d) + self.perspective(1.0 - g, 1.0 - q, -d)

    def binary_derivative(self, increment, target_prob):
        """dB_f/dgamma at gamma = q + increment in [q, 1), or None without a derivative."""
        if self.binary_derivative_fn is None:
            return None
        d, q = _as_float_pair(increment, target_prob)
        return self.binary_derivative_fn(q, d)

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_callable(
        cls,
        name: str,
        f: Callable,
        f_second_at_one: float,
        *,
        f_prime: Callable | None = None,
        f_third_at_one: float | None = None,
        slope_at_infinity: float = math.inf,
        description: str = "",
    ) -> FDivergence:
        """A user divergence from a vectorised Python generator f(t) and its f''(1).

        ``f_prime`` (f'(t), vectorised) enables Newton steps in the vectorised solver;
        ``slope_at_infinity`` = lim f(t)/t (default inf, as for KL) fixes the q = 0 edge.
        The divergence is evaluated as written, so it may lose digits where the built-ins do not.
        """
        derivative = None
        if f_prime is not None:

            def derivative(q, d, _fp=f_prime):
                with np.errstate(all="ignore"):
                    return _fp(1 + d / q) - _fp(1 - d / (1 - q))

        return cls(
            name=name.lower(),
            f=f,
            f_second_at_one=float(f_second_at_one),
            f_third_at_one=None if f_third_at_one is None else float(f_third_at_one),
            binary_derivative_fn=derivative,
            slope_at_infinity=float(slope_at_infinity),
            description=description,
            f_prime=f_prime,
        )

    @classmethod
    def from_sympy(cls, name: str, expr, t=None, description: str = "") -> FDivergence:
        """A user divergence from a SymPy expression of the generator f(t).

        f'(t), f''(1), f'''(1) and lim f(t)/t are derived symbolically, so the result has
        the same solver support as a built-in (but evaluates f as written).
        """
        from ._symbolic import generator_facts

        facts = generator_facts(expr, t)
        return dataclasses.replace(
            cls.from_callable(
                name,
                facts.f,
                facts.f_second_at_one,
                f_prime=facts.f_prime,
                f_third_at_one=facts.f_third_at_one,
                slope_at_infinity=facts.slope_at_infinity,
                description=description or f"f(t) = {facts.expr}",
            ),
            sympy_generator=str(facts.expr.subs(facts.t, _sympy_t())),
        )


_GRID = np.unique(np.concatenate([np.geomspace(1e-4, 1e4, 161), np.linspace(0.05, 4.0, 80), [1.0]]))


def _check_generator(name, f):
    """f(1) = 0, f finite on (0, inf) and convex there, checked on a grid; a ValueError says which failed."""
    with np.errstate(all="ignore"):
        try:
            at_one = float(np.asarray(f(np.float64(1.0)), dtype=np.float64))
            values = np.asarray(f(_GRID.copy()), dtype=np.float64)
        except Exception as exc:  # a generator that cannot be evaluated on floats
            raise ValueError(f"divergence {name!r}: the generator f could not be evaluated on floats ({exc})") from None
    if values.shape != _GRID.shape:
        raise ValueError(f"divergence {name!r}: f must be vectorised (f(array) of the same shape); got {values.shape}")
    if not np.isfinite(at_one) or abs(at_one) > 1e-12:
        raise ValueError(
            f"divergence {name!r}: f(1) must be 0 (an f-divergence vanishes at h = q); got f(1) = {at_one!r}"
        )
    bad = ~np.isfinite(values)
    if bad.any():
        t = float(_GRID[bad][0])
        raise ValueError(f"divergence {name!r}: f must be finite on (0, inf); f({t:g}) = {float(values[bad][0])!r}")
    t0, t1, t2 = _GRID[:-2], _GRID[1:-1], _GRID[2:]
    f0, f1, f2 = values[:-2], values[1:-1], values[2:]
    chord = ((t2 - t1) * f0 + (t1 - t0) * f2) / (t2 - t0)
    tol = 1e-9 * (np.abs(f0) + np.abs(f1) + np.abs(f2)) + 1e-12
    bad = f1 > chord + tol
    if bad.any():
        t = float(t1[bad][0])
        raise ValueError(
            f"divergence {name!r}: f must be convex, but f({t:g}) = {float(f1[bad][0]):.6g} lies above the chord "
            f"between its neighbours ({float(chord[bad][0]):.6g}): an f-divergence needs a convex generator"
        )


_BUILTINS = (
    FDivergence(
        name="kl",
        sympy_generator="t*log(t)",
        f=lambda t: special.xlogy(t, t),
        f_second_at_one=1.0,
        f_third_at_one=-1.0,
        perspective_fn=_kl_perspective,
        binary_derivative_fn=_kl_dgamma,
        safe_increment_fn=_safe_from_chi2(_sqrt_expm1),  # KL <= log(1 + chi2)
        slope_at_infinity=math.inf,
        description="Kullback-Leibler KL(h || q), f(t) = t log t (the paper's choice)",
    ),
    FDivergence(
        name="reverse_kl",
        sympy_generator="-log(t)",
        f=lambda t: -np.log(t),
        f_second_at_one=1.0,
        f_third_at_one=-2.0,
        perspective_fn=_reverse_kl_perspective,
        binary_derivative_fn=_reverse_kl_dgamma,
        safe_increment_fn=_reverse_kl_safe,
        slope_at_infinity=0.0,
        description="reverse KL, KL(q || h), f(t) = -log t",
    ),
    FDivergence(
        name="chi2",
        sympy_generator="(t - 1)**2",
        f=lambda t: (t - 1.0) ** 2,
        f_second_at_one=2.0,
        f_third_at_one=0.0,
        perspective_fn=_chi2_perspective,
        binary_derivative_fn=_chi2_dgamma,
        safe_increment_fn=_safe_from_chi2(np.sqrt),  # exact: B = (gamma - q)^2 / (q (1 - q))
        inverse_increment_fn=_chi2_inverse,
        slope_at_infinity=math.inf,
        description="Pearson chi-squared, f(t) = (t - 1)^2",
    ),
    FDivergence(
        name="hellinger",
        sympy_generator="(sqrt(t) - 1)**2",
        f=lambda t: (np.sqrt(t) - 1.0) ** 2,
        f_second_at_one=0.5,
        f_third_at_one=-0.75,
        perspective_fn=_hellinger_perspective,
        binary_derivative_fn=_hellinger_dgamma,
        safe_increment_fn=_safe_from_chi2(np.sqrt),  # H^2 <= chi2
        inverse_increment_fn=_hellinger_inverse,
        slope_at_infinity=1.0,
        description="squared Hellinger sum (sqrt h - sqrt q)^2 (range [0, 2]), f(t) = (sqrt t - 1)^2",
    ),
    FDivergence(
        name="tv",
        f=lambda t: 0.5 * np.abs(t - 1.0),
        f_second_at_one=None,
        kink=1.0,
        perspective_fn=_tv_perspective,
        binary_derivative_fn=_tv_dgamma,
        safe_increment_fn=lambda q, delta: np.asarray(delta, dtype=np.float64),  # exact: B = gamma - q
        inverse_increment_fn=lambda q, delta: np.asarray(delta, dtype=np.float64),
        slope_at_infinity=0.5,
        description="total variation, f(t) = |t - 1| / 2 (B = gamma - q: every closed form is exact)",
    ),
    FDivergence(
        name="js",
        sympy_generator="(t*log(t) - (1 + t)*log((1 + t)/2))/2",
        f=lambda t: 0.5 * (special.xlogy(t, t) - special.xlogy(1.0 + t, 0.5 * (1.0 + t))),
        f_second_at_one=0.25,
        f_third_at_one=-0.375,
        perspective_fn=_js_perspective,
        binary_derivative_fn=_js_dgamma,
        safe_increment_fn=_safe_from_chi2(lambda d: np.sqrt(2.0 * d)),  # JS <= chi2 / 2
        slope_at_infinity=math.log(2.0) / 2.0,
        description="Jensen-Shannon (natural log, range [0, log 2]), f(t) = (t log t - (1+t) log((1+t)/2)) / 2",
    ),
)

_REGISTRY: dict[str, FDivergence] = {d.name: d for d in _BUILTINS}
for _d in _BUILTINS:
    _generators.record(_d.name, _d.sympy_generator)
_ALIASES = {
    "kullback_leibler": "kl",
    "forward_kl": "kl",
    "rkl": "reverse_kl",
    "reverse-kl": "reverse_kl",
    "pearson": "chi2",
    "chi_squared": "chi2",
    "squared_hellinger": "hellinger",
    "total_variation": "tv",
    "jensen_shannon": "js",
}


def _sympy_t():
    import sympy as sp

    return sp.Symbol("t", positive=True)


def available_divergences() -> tuple[str, ...]:
    """Names accepted wherever a divergence is expected."""
    return tuple(_REGISTRY)


def register_divergence(div: FDivergence, *, overwrite: bool = False) -> FDivergence:
    """Make ``div`` usable by its name (``divergence="name"``) everywhere in the package."""
    if not isinstance(div, FDivergence):
        raise TypeError(
            f"div must be an FDivergence (build one with FDivergence.from_callable or .from_sympy); got {div!r}"
        )
    if div.name in _REGISTRY and not overwrite and _REGISTRY[div.name] is not div:
        raise ValueError(f"a divergence named {div.name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[div.name] = div
    _generators.record(div.name, div.sympy_generator)
    return div


def get_divergence(div) -> FDivergence:
    """Resolve a divergence given by name or as an FDivergence object."""
    if isinstance(div, FDivergence):
        return div
    if isinstance(div, str):
        key = div.lower().strip()
        key = _ALIASES.get(key, key)
        if key in _REGISTRY:
            return _REGISTRY[key]
        raise ValueError(f"divergence must be one of {sorted(_REGISTRY)} (or an FDivergence object); got {div!r}")
    raise ValueError(f"divergence must be a name or an FDivergence object; got {div!r}")


def binary_divergence(gamma, target_prob, divergence="kl"):
    """Two-point divergence B_f(gamma; q) = q f(gamma/q) + (1 - q) f((1 - gamma)/(1 - q)).

    This is D_f(h || q) for the Cactus surrogate h (Hao & Mou, ICLR 2026, Theorem 2), which raises the drafted
    token to gamma and scales the rest of q proportionally. Vectorised with NumPy broadcasting;
    exact at the edges (q or gamma in {0, 1}); a few ulp relative error for the built-ins.

    Parameters
    ----------
    gamma, target_prob : array_like of probabilities in [0, 1]
    divergence : str or FDivergence

    Examples
    --------
    >>> import numpy as np
    >>> float(binary_divergence(1.0, 0.25))        # KL: -log q
    1.3862943611198906
    >>> float(binary_divergence(0.5, 0.25, "chi2"))  # (gamma - q)^2 / (q (1 - q))
    0.3333333333333333
    """
    div = get_divergence(divergence)
    g = as_probability(gamma, "gamma")
    q = as_probability(target_prob, "target_prob")
    g, q = broadcast(gamma=g, target_prob=q)
    out = np.asarray(div.binary(g, q), dtype=np.float64)
    return out[()] if out.ndim == 0 else out


def divergence(dist, target_probs, divergence="kl", *, atol=1e-6):
    """D_f(dist || target_probs) = sum_x q(x) f(dist(x)/q(x)) over the last axis.

    The independent reference for ``binary_divergence``; batched over leading axes.
    Raises ValueError for rows that are negative, non-finite or not normalised within ``atol``.

    Examples
    --------
    >>> float(divergence([0.5, 0.5], [0.25, 0.75], "tv"))
    0.25
    """
    div = get_divergence(divergence)
    h = np.asarray(check_distribution(np.asarray(dist, dtype=np.float64), "dist", atol))
    q = np.asarray(check_distribution(np.asarray(target_probs, dtype=np.float64), "target_probs", atol))
    if h.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"dist and target_probs must share one vocabulary (last axis); got {h.shape[-1]} and {q.shape[-1]}"
        )
    h, q = broadcast(dist=h, target_probs=q)
    out = np.sum(div.perspective(h, q), axis=-1)
    return out[()] if np.ndim(out) == 0 else out
