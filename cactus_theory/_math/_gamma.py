"""The Cactus bonus gamma*: exact (root-finding) and closed-form approximations.

gamma*(q, delta) is the largest gamma in [q, 1] with B_f(gamma; q) <= delta, where B_f is the
two-point divergence of ``binary_divergence`` (Hao & Mou, ICLR 2026, Theorem 2). B_f is 0 at
gamma = q and increasing on [q, 1], so [q, 1] is a proven bracket: gamma* = 1 if
B_f(1; q) <= delta, otherwise the unique root of B_f(gamma; q) = delta in (q, 1).

``exact_gamma`` returns a float, so it returns the largest float it can *prove* feasible: the
solvers find the root in float64, then a certification step moves along the float grid to the
largest gamma whose B_f, evaluated in long double with a bound on its rounding error, stays
within delta.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import optimize

from ._divergences import FDivergence, get_divergence
from ._gamma_kernels import dd_residuals, exact_closed_gamma, exact_kl_gamma
from ._gamma_result import GammaResult
from ._jit import HAVE_NUMBA
from ._validation import as_delta, as_probability, broadcast, check_int

__all__ = ["APPROX_METHODS", "GammaResult", "approx_gamma", "exact_gamma"]

_EPS = float(np.finfo(np.float64).eps)
_BIG = 1e300
_TINY = float(np.finfo(np.float64).smallest_subnormal)
#: Relative error bound of B_f in long double for the built-in perspective forms (tested at 50
#: digits): the certification accepts gamma when B_f * _LD_FACTOR <= delta (in long double).
_LD_FACTOR = np.longdouble(1) + 256 * np.finfo(np.longdouble).eps


class GammaConvergenceWarning(RuntimeWarning):
    """exact_gamma stopped at ``maxiter`` for some elements (as scipy warns); the result is still feasible."""


#: Closed forms offered by ``approx_gamma``.
APPROX_METHODS = ("taylor", "taylor3", "newton", "safe")


def _inputs(target_prob, delta):
    q = as_probability(target_prob, "target_prob")
    d = as_delta(delta)
    q, d = broadcast(target_prob=q, delta=d)
    return q, d


def _scalar_out(arr):
    return arr[()] if arr.ndim == 0 else arr


def _taylor_increment(div: FDivergence, q, delta):
    """Second-order (Corollary 5) increment gamma - q, unclipped; first order for a kinked f.
    ``q`` and ``delta`` share one shape (or ``delta`` is a scalar): three passes, one array."""
    with np.errstate(all="ignore"):
        if div.f_second_at_one is None:
            return delta / div.kink
        inc = (1.0 - q) * q
        inc *= 2.0 * delta / div.f_second_at_one
        return np.sqrt(inc, out=inc) if isinstance(inc, np.ndarray) else np.sqrt(inc)


def _safe_increment(div: FDivergence, q, delta):
    """The provably feasible closed-form increment, shrunk by 64 ulp to cover its own rounding."""
    with np.errstate(all="ignore"):
        return np.asarray(div.safe_increment_fn(q, delta), dtype=np.float64) * (1.0 - 64 * _EPS)


def _closed_inverse(div: FDivergence, q, delta):
    """gamma* from the divergence's exact inverse (a start for the certification)."""
    with np.errstate(all="ignore"):
        inc = np.asarray(div.inverse_increment_fn(q, delta), dtype=np.float64)
        gamma = np.where(inc >= 1.0 - q, 1.0, q + np.maximum(inc, 0.0))
    gamma = np.where(np.isinf(delta) | (q == 1), 1.0, gamma)
    gamma = np.where((q == 0) & bool(np.isinf(div.perspective(1.0, 0.0))), 0.0, gamma)  # as _exact_edges
    return np.where(delta == 0, q, gamma)


def _solve_newton(div: FDivergence, q, delta, xtol, rtol, maxiter):
    """Vectorised bracketed Newton for B_f(q + d; q) = delta, with a bisection safeguard.

    The unknown is the increment d = gamma - q on [0, 1 - q], so B_f never sees a rounded
    difference. Newton steps are taken on log B against log d (exact for power laws, so
    exact in both the quadratic and the linear regime of B and indifferent to magnitude);
    the bracket [safe closed form, 1 - q] is kept and bisected (geometrically across
    decades) when a step leaves it. Without a derivative, secant steps on
    sqrt(B) - sqrt(delta) replace Newton steps.
    """
    n = q.size
    hi = 1.0 - q
    # The provably feasible closed form (approx_gamma(method="safe")) is a lower end of the
    # bracket within a small factor of the root; without one, the bracket starts at 0.
    lo = np.zeros(n)
    if div.safe_increment_fn is not None:
        safe = _safe_increment(div, q, delta)
        lo = np.where(np.isfinite(safe) & (safe > 0) & (safe < hi), safe, 0.0)
    x = _taylor_increment(div, q, delta)
    bad_start = ~((x > lo) & (x < hi))
    x[bad_start] = np.where(lo > 0, np.sqrt(lo) * np.sqrt(hi), 0.5 * hi)[bad_start]
    sqrt_delta = np.sqrt(delta)
    inc = np.full(n, np.nan)
    iterations = np.zeros(n, dtype=np.int64)
    converged = np.zeros(n, dtype=bool)
    active = np.arange(n)
    x_prev = np.full(n, np.nan)
    f_prev = np.full(n, np.nan)
    with np.errstate(all="ignore"):
        for it in range(1, maxiter + 1):
            qa, da, xa = q[active], delta[active], x[active]
            b = div.binary_increment(xa, qa)
            fa = np.sqrt(b) - sqrt_delta[active]
            above = fa > 0
            la = lo[active] = np.where(above, lo[active], xa)
            ha = hi[active] = np.where(above, xa, hi[active])
            db = div.binary_derivative(xa, qa)
            if db is not None:
                # First choice: Newton in log-log coordinates (log B against log d), exact for
                # B = c d^k, so exact both where B is quadratic (d << q) and where it is linear
                # (q = 0 with finite slope), at any magnitude. Second: Newton on B - delta from
                # above (B is convex: it stays above the root) or on sqrt(B) - sqrt(delta) from
                # below. Bisection if both leave the bracket.
                usable = np.isfinite(db) & (db > 0)
                elasticity = xa * db / b
                first = xa * np.exp(-(np.log(b) - np.log(da)) / elasticity)  # multiplicative: no cancellation
                first = np.where(usable & np.isfinite(first), first, np.nan)
                plain = np.where(usable, (b - da) / db, np.nan)
                rooted = np.where(usable, 2.0 * (b - np.sqrt(b) * sqrt_delta[active]) / db, np.nan)
                second = xa - np.where(above, plain, rooted)
            else:
                first = xa - fa * (xa - x_prev[active]) / (fa - f_prev[active])
                second = np.full_like(first, np.nan)
            tol = xtol + rtol * (qa + xa)
            outside = ~((first >= la) & (first <= ha))  # also catches NaN; an end is a valid answer
            x_new = np.where(outside, second, first)
            step = xa - x_new
            # A step below the tolerance ends the search even if rounding put it just outside
            # the bracket; otherwise a step outside (or NaN) is replaced by bisection, geometric
            # while the bracket spans decades.
            small = (np.abs(step) <= tol) | (fa == 0)
            outside = ~((x_new > la) & (x_new < ha))
            mid = np.where((la > 0) & (ha > 4 * la), np.sqrt(la) * np.sqrt(ha), 0.5 * (la + ha))
            x_new = np.where(small, np.clip(x_new, la, ha), np.where(outside, mid, x_new))
            x_new = np.where(fa == 0, xa, x_new)
            # A small Newton step does not prove closeness (B' can be huge near gamma = 1):
            # certify it by the sign of F one tolerance-width beyond it, on the unknown side.
            check = np.flatnonzero(small & (fa != 0))
            if check.size:
                side = np.where(above[check], -2.0, 2.0)
                probe = np.clip(x_new[check] + side * tol[check], la[check], ha[check])
                at_end = (probe == la[check]) | (probe == ha[check])
                fp = np.sqrt(div.binary_increment(probe, qa[check])) - sqrt_delta[active[check]]
                certified = at_end | np.where(above[check], fp <= 0, fp > 0)
                idx = active[check]
                lo[idx] = np.where(fp <= 0, np.maximum(lo[idx], probe), lo[idx])
                hi[idx] = np.where(fp > 0, np.minimum(hi[idx], probe), hi[idx])
                small[check] = certified
                x_new[check] = np.where(certified, x_new[check], probe)
            collapsed = ((ha - la <= tol) | (np.nextafter(la, np.inf) >= ha)) & ~small  # no float left inside
            x_new = np.where(collapsed, la, x_new)  # the feasible end (B <= delta there)
            done = small | collapsed
            x_prev[active], f_prev[active] = xa, fa
            x[active] = x_new
            iterations[active] = it
            inc[active[done]] = x_new[done]
            converged[active[done]] = True
            active = active[~done]
            if active.size == 0:
                break
    inc[active] = x[active]
    return q + inc, iterations, converged


def _upper_binary(div: FDivergence, q, g):
    """An upper bound of B_f(g; q) for g in [q, 1] (long double): the built-in forms evaluated in
    long double and raised by their error bound, a generator evaluated as written in float64
    plus its rounding bound (``FDivergence.rounding_bound``). NaN counts as infinite."""
    d = g.astype(np.longdouble) - q.astype(np.longdouble)
    precise = div.binary_increment_precise(d, q)
    with np.errstate(all="ignore"):
        if precise is not None:
            out = precise * _LD_FACTOR
        else:
            d64 = d.astype(np.float64)
            out = (div.binary_increment(d64, q) + div.rounding_bound(d64, q)).astype(np.longdouble)
    out = np.where(np.isnan(out), np.inf, out)
    return np.where(d <= 0, 0.0, out)


def _bisect_floats(feasible, idx, lo, hi):
    """Per element, the largest float in [lo, hi) that ``feasible`` accepts, given that lo is
    feasible and hi is not: bisection on the floats' bit patterns (monotone for x >= 0)."""
    lo_bits, hi_bits = lo.view(np.int64).copy(), hi.view(np.int64).copy()
    while True:
        live = np.flatnonzero(hi_bits - lo_bits > 1)
        if live.size == 0:
            return lo_bits.view(np.float64)
        mid_bits = lo_bits[live] + (hi_bits[live] - lo_bits[live]) // 2
        ok = feasible(idx[live], mid_bits.view(np.float64))
        lo_bits[live] = np.where(ok, mid_bits, lo_bits[live])
        hi_bits[live] = np.where(ok, hi_bits[live], mid_bits)


def _gallop(feasible, idx, start, limit, direction):
    """From floats ``start`` (feasible when going up, infeasible when going down), probe 1, 2,
    4, ... ulps away towards ``limit`` until the probe changes side; returns (feasible end,
    infeasible end) brackets for ``_bisect_floats``. The limit itself is taken to be on the
    far side (q is feasible, 1 is not, or was checked by the caller)."""
    bits = start.view(np.int64).copy()
    limit_bits = limit.view(np.int64)
    near = bits.copy()  # last probe on the start's side
    far = limit_bits.copy()
    step = np.ones(bits.size, dtype=np.int64)
    live = np.arange(bits.size)
    while live.size:
        probe = near[live] + direction * step[live]
        past = (probe >= limit_bits[live]) if direction > 0 else (probe <= limit_bits[live])
        probe = np.where(past, limit_bits[live], probe)
        ok = feasible(idx[live], probe.view(np.float64))
        same_side = ok if direction > 0 else ~ok
        same_side &= ~past
        near[live[same_side]] = probe[same_side]
        far[live[~same_side]] = probe[~same_side]
        step[live] *= 2
        live = live[same_side]
    if direction > 0:
        return near.view(np.float64), far.view(np.float64)
    return far.view(np.float64), near.view(np.float64)


def _certify(div: FDivergence, q, delta, gamma):
    """The largest float g in [q, 1] whose B_f(g; q) provably stays within delta, searched on the
    float grid around the solver's ``gamma``: probes 1, 2, 4, ... ulps away until the side
    changes, then bisection on the bit patterns inside the last step (about 2 + 2 log2(k)
    evaluations when gamma is k ulps off). Returns (gamma, evaluations of B_f per element)."""
    g = np.clip(np.asarray(gamma, dtype=np.float64), q, 1.0)
    calls = np.zeros(g.size, dtype=np.int64)
    delta_ld = delta.astype(np.longdouble)

    def feasible(idx, x):
        calls[idx] += 1
        return (x <= q[idx]) | (_upper_binary(div, q[idx], x) <= delta_ld[idx])

    everyone = np.arange(g.size)
    ok = feasible(everyone, g)
    down = np.flatnonzero(~ok)  # gamma overspends: search towards q (feasible)
    if down.size:
        lo, hi = _gallop(feasible, down, g[down], q[down], -1)
        g[down] = _bisect_floats(feasible, down, lo, hi)
    up = np.flatnonzero(ok & (g < 1.0))  # gamma is feasible: is the next float too?
    if up.size:
        top = feasible(up, np.ones(up.size))
        g[up[top]] = 1.0
        rest = up[~top]
        if rest.size:
            lo, hi = _gallop(feasible, rest, g[rest], np.ones(rest.size), 1)
            g[rest] = _bisect_floats(feasible, rest, lo, hi)
    return g, calls


def _solve_scalar(div: FDivergence, q, delta, xtol, rtol, maxiter, method):
    """A loop of scipy root finders on sqrt(B_f(q + d; q)) - sqrt(delta) in y = log(d / d0).

    Working in y = log(gamma - q) lets the bracketing solvers cross hundreds of decades
    (roots near 1e-300 above q) in a few dozen steps; an absolute tolerance on y is a
    relative one on the increment. B_f = inf (gamma = 1 for reverse KL, overflow for a
    subnormal q) is capped at a large finite value, which keeps the sign the solvers need.
    """
    solver = {"brentq": optimize.brentq, "toms748": optimize.toms748}[method]
    gamma = np.empty(q.size)
    iterations = np.zeros(q.size, dtype=np.int64)
    converged = np.zeros(q.size, dtype=bool)
    # y = log(d / d0) with d0 the Taylor increment, so that y ~ 0 at the root and the solvers'
    # relative tolerance on y costs nothing.
    d0 = _taylor_increment(div, q, delta)
    d0 = np.where(np.isfinite(d0) & (d0 > 0), d0, 1.0)
    for i, (qi, di, si) in enumerate(zip(q.tolist(), delta.tolist(), d0.tolist(), strict=False)):

        def objective_d(d, qi, di):
            return min(math.sqrt(float(div.binary_increment(d, qi))) - math.sqrt(di), _BIG)

        lo, hi = math.log(_TINY) - math.log(si), math.log1p(-qi) - math.log(si)

        def objective(y, qi=qi, di=di, si=si, hi=hi):
            # clamp to the bracket: exp(log(.)) may round past 1 - q
            return objective_d(1.0 - qi if y >= hi else min(si * math.exp(y), 1.0 - qi), qi, di)

        if objective(lo) > 0:  # the root lies below the smallest positive float: d = 0
            gamma[i], iterations[i], converged[i] = qi, 0, True
            continue
        with np.errstate(all="ignore"):  # the capped value can overflow the solvers' interpolation
            root, info = solver(
                objective,
                lo,
                hi,
                xtol=max(rtol, _EPS) + xtol,
                rtol=4 * _EPS,
                maxiter=maxiter,
                full_output=True,
                disp=False,
            )
        # Polish on d itself, where the solvers' tolerance is relative to d.
        d1 = si * math.exp(root)
        lo_d, hi_d = d1 * (1 - 1e-9), min(d1 * (1 + 1e-9), 1.0 - qi)
        n_iter = info.iterations
        if objective_d(lo_d, qi, di) <= 0 < objective_d(hi_d, qi, di):
            with np.errstate(all="ignore"):
                d1, info = solver(
                    objective_d,
                    lo_d,
                    hi_d,
                    args=(qi, di),
                    xtol=max(xtol, _TINY),
                    rtol=max(rtol, 4 * _EPS),
                    maxiter=maxiter,
                    full_output=True,
                    disp=False,
                )
            n_iter += info.iterations
        gamma[i], iterations[i], converged[i] = qi + d1, n_iter, info.converged
    return gamma, iterations, converged


def exact_gamma(
    target_prob,
    delta,
    divergence="kl",
    *,
    method="auto",
    xtol=0.0,
    rtol=4 * _EPS,
    maxiter=100,
    full_output=False,
    tight=True,
):
    """Exact Cactus bonus gamma* = max{gamma in [q, 1] : B_f(gamma; q) <= delta}.

    Solves B_f(gamma; q) = delta on the proven bracket [q, 1] (Hao & Mou, ICLR 2026, Theorem 2); gamma* = 1
    when B_f(1; q) <= delta. Broadcasts like a NumPy ufunc over ``target_prob`` and ``delta``.

    Parameters
    ----------
    target_prob : array_like
        q(n), the verifier's probability of the drafted token, in [0, 1].
    delta : array_like
        Divergence budget, >= 0. ``inf`` is the limit delta -> inf: gamma* = 1, except q = 0
        under a divergence with f(t)/t -> inf (KL, chi2), where every gamma > 0 has an infinite
        divergence and gamma* stays 0.
    divergence : str or FDivergence
        "kl" (default, the paper's), "reverse_kl", "chi2", "hellinger", "tv", "js" or a
        registered / user FDivergence.
    method : {"auto", "newton", "brentq", "toms748"}
        "auto" (default): the divergence's exact closed-form inverse where it has one (chi2:
        gamma = q + sqrt(delta q (1 - q)); squared Hellinger: gamma = sin^2(b + 2 arcsin(sqrt(delta)/2))
        with q = sin^2 b; TV: gamma = q + delta); for KL with numba installed, a compiled
        per-pair kernel (a sixth-order series start, Newton / Halley steps, then one evaluation
        of B to 2^-60 with a bounded expansion around it, double-double where that cannot
        decide: the largest feasible float at 50 digits; long double only for q or 1 - gamma
        below 1e-280), about 10x the Taylor closed form per pair (``docs/results/bench.md``);
        otherwise "newton". Same accuracy contract.
        "newton": vectorised bracketed Newton (secant without a derivative) on
        sqrt(B_f) = sqrt(delta) with a bisection safeguard. "brentq" / "toms748": a Python
        loop of ``scipy.optimize`` calls on the same bracket (the scalar reference path).
    xtol, rtol : float
        Stopping tolerance on gamma: abs(step) <= xtol + rtol * gamma (or bracket width).
    maxiter : int
    full_output : bool
        Also return a ``GammaResult`` with iterations, convergence flags, the method used, the
        residual B_f(gamma; q) - delta and the number of B_f evaluations.
    tight : bool
        True (default): the 2-ulp contract below. False (the compiled KL kernel only): for the
        rare pairs its 2^-60 evaluation cannot decide, gamma is the largest float that float64
        with its error bound certifies, so it still never spends more than delta, but may lie
        below the largest feasible float by the width of that bound (about 10 eps of B_f: up
        to about 20 ulp); no double-double step. Measured on 10^6 pairs: the same gammas as
        True, at the same speed (``docs/results/bench.md``).

    Returns
    -------
    gamma : float64 ndarray (0-d input gives a NumPy scalar)
    result : GammaResult, only if ``full_output``

    Notes
    -----
    Accuracy contract (built-in divergences; tested against mpmath at 50 digits over every
    built-in divergence, subnormal q and delta included): the returned gamma never spends more
    than delta, B_f(gamma; q) <= delta exactly (``residual`` <= 0), and it is the largest such
    float to within 2 ulp; gamma = 1 only where B_f(1; q) <= delta; gamma is nondecreasing in
    delta. The solvers stop at ``xtol + rtol * gamma``; a certification step then moves along the
    float grid to the largest gamma whose B_f, evaluated in long double and raised by its error
    bound (256 long-double ulp), stays within delta (KL, chi2 and squared Hellinger with numba:
    compiled, in float64 with an error bound and double-double where that cannot decide, giving
    the largest feasible float itself). Where long double is no wider than double
    (some platforms), gamma still never overspends but may lie a few hundred ulp below the
    largest feasible float. For a generator evaluated as written (``FDivergence.from_callable``
    / ``from_sympy``) the certification uses float64 plus a bound on its rounding, so gamma is
    feasible as far as f itself is accurate, and may be conservative where the terms cancel.
    Elements that reach ``maxiter`` raise a ``GammaConvergenceWarning`` (their gamma is still
    certified feasible). Exact edge cases: delta = 0 gives q; q = 1 gives 1; q = 0 gives 0 when
    f(t)/t -> inf (KL, chi2), for every delta, inf included; otherwise delta = inf gives 1.

    Examples
    --------
    >>> round(float(exact_gamma(0.3, 1.0)), 12)
    0.959468268041
    >>> exact_gamma([0.5, 0.9], 0.05, "chi2")   # closed form q + sqrt(delta q (1 - q))
    array([0.6118034 , 0.96708204])
    >>> float(exact_gamma(0.25, 2.0))           # -log 0.25 <= 2: the budget covers gamma = 1
    1.0
    """
    div = get_divergence(divergence)
    if method not in ("auto", "newton", "brentq", "toms748"):
        raise ValueError(f"method must be 'auto', 'newton', 'brentq' or 'toms748'; got {method!r}")
    if not (xtol >= 0 and rtol >= 0 and np.isfinite(xtol) and np.isfinite(rtol)):
        raise ValueError(f"xtol and rtol must be finite and >= 0; got xtol={xtol!r}, rtol={rtol!r}")
    check_int(maxiter, "maxiter", 1)
    q, delta = _inputs(target_prob, delta)
    shape = q.shape
    q, delta = q.ravel(), delta.ravel()
    if method == "auto":
        if div.inverse_increment_fn is not None:
            method = "closed-form inverse"
        elif _compiled_builtin(div, "kl"):
            method = "compiled KL kernel"
        else:
            method = "newton"
    compiled_closed = method == "closed-form inverse" and _compiled_builtin(div, "chi2", "hellinger")
    if method == "compiled KL kernel" or compiled_closed:
        # the kernels decide the edge cases themselves (as _exact_edges does), so every pair goes in
        if compiled_closed:
            gamma, status, calls = exact_closed_gamma(div.name, q, delta)
            iterations = np.zeros(q.size, dtype=np.int64)
            converged = np.ones(q.size, dtype=bool)
        else:
            gamma, status, iterations, converged = exact_kl_gamma(q, delta, tight=tight, maxiter=maxiter)
            # the search's evaluations and the certification's (counted only when asked for)
            calls = np.where(status == 2, 0, iterations + 1) if full_output else None
        undecided = np.flatnonzero(status == 1)  # left for the long-double certification
        if undecided.size:
            gamma[undecided], extra = _certify(div, q[undecided], delta[undecided], gamma[undecided])
            if calls is not None:
                calls[undecided] += extra
    else:
        gamma, decided = _exact_edges(div, q, delta)
        iterations = np.zeros(q.size, dtype=np.int64)
        calls = np.zeros(q.size, dtype=np.int64)
        converged = np.ones(q.size, dtype=bool)
        todo = np.flatnonzero(~decided)
    if not (method == "compiled KL kernel" or compiled_closed) and todo.size:
        qt, dt = q[todo], delta[todo]
        if method == "closed-form inverse":
            start = _closed_inverse(div, qt, dt)
        else:
            start = np.full(todo.size, np.nan)
            rest = np.ones(todo.size, dtype=bool)
            # B_f(1; q) <= delta: the budget covers gamma = 1 (certified below like any other start)
            with np.errstate(all="ignore"):
                covered = np.asarray(div.binary(np.ones(todo.size), qt)) <= dt
            start[covered] = 1.0
            rest &= ~covered
            sub = np.flatnonzero(rest)
            if sub.size:
                solve = _solve_newton if method == "newton" else _solve_scalar
                args = (xtol, rtol, maxiter) if method == "newton" else (xtol, rtol, maxiter, method)
                g, it, conv = solve(div, qt[sub], dt[sub], *args)
                start[sub] = g
                iterations[todo[sub]] = it
                converged[todo[sub]] = conv
                calls[todo[sub]] = it
        start = np.where(np.isfinite(start), start, qt)
        gamma[todo], extra = _certify(div, qt, dt, start)
        calls[todo] += extra
    n_bad = int((~converged).sum())
    if n_bad:
        warnings.warn(
            f"exact_gamma: {n_bad} of {converged.size} elements did not converge in maxiter={maxiter} iterations; "
            "their gamma is certified feasible (B_f <= delta) but may lie below the root: raise maxiter",
            GammaConvergenceWarning,
            stacklevel=2,
        )
    out = _scalar_out(gamma.reshape(shape))
    if not full_output:
        return out
    flag = (
        "converged" if n_bad == 0 else f"{n_bad} of {converged.size} elements did not converge in {maxiter} iterations"
    )
    return out, GammaResult(
        gamma=np.asarray(out),
        iterations=iterations.reshape(shape),
        converged=converged.reshape(shape),
        method=method,
        flag=flag,
        residual=_residual(div, q, delta, gamma).reshape(shape),
        function_calls=calls.reshape(shape),
    )


def _exact_edges(div: FDivergence, q, delta):
    """Gamma where it is exact without evaluating B_f: delta = 0 gives q; q = 0 with f(t)/t -> inf
    gives 0 for every delta, infinite included (nothing above 0 has a finite divergence, and
    delta = inf is the limit delta -> inf, not a licence for an infinite one); delta = inf or
    q = 1 gives 1 otherwise. Returns (gamma, decided)."""
    gamma = np.full(q.shape, np.nan)
    decided = np.zeros(q.shape, dtype=bool)
    for mask, value in (
        (delta == 0, q),
        ((q == 0) & bool(np.isinf(div.perspective(1.0, 0.0))), 0.0),
        (np.isinf(delta) | (q == 1), 1.0),
    ):
        mask = mask & ~decided
        gamma[mask] = value[mask] if np.ndim(value) else value
        decided |= mask
    return gamma, decided


def _compiled_builtin(div: FDivergence, *names) -> bool:
    """Whether ``div`` is one of the built-in divergences ``names`` and numba compiles their kernels."""
    return HAVE_NUMBA and div.name in names and div is get_divergence(div.name)


def _residual(div: FDivergence, q, delta, gamma):
    """B_f(gamma; q) - delta as float64: from double-double for KL, chi2 and squared Hellinger
    with numba (the kernels' own evaluations, about 2^-98 of B), in long double elsewhere (where
    the divergence has a precise form). Every gamma here is certified feasible, so a value
    above 0 can only be the evaluation's own rounding at a tie closer than its bound: it is
    reported as 0."""
    out = np.full(q.shape, np.nan)
    if _compiled_builtin(div, "kl", "chi2", "hellinger"):
        out = dd_residuals(div.name, q, delta, gamma)
    rest = np.isnan(out)
    if rest.any():
        qr, dr, gr = q[rest], delta[rest], gamma[rest]
        with np.errstate(all="ignore"):
            d = gr.astype(np.longdouble) - qr.astype(np.longdouble)
            precise = div.binary_increment_precise(d, qr)
            b = precise if precise is not None else np.asarray(div.binary_increment(d.astype(np.float64), qr))
            value = (np.where(d <= 0, 0.0, b) - dr.astype(np.longdouble)).astype(np.float64)
        out[rest] = np.where(np.isinf(dr), -np.inf, value)
    return np.minimum(out, 0.0)


def approx_gamma(target_prob, delta, divergence="kl", method="taylor"):
    """Closed-form approximations of the Cactus bonus gamma* (no root-finding).

    All need only q(n) (the draft distribution does not enter gamma) and are clipped to [q, 1].

    ``method``:

    - "taylor" (the paper's Corollary 5, used by the authors' code)::

          gamma = q + sqrt(2 delta q (1 - q) / f''(1))

      Approximation; exceeds delta in part of the (q, delta) plane (for KL: never where
      gamma <= 0.5, Corollary 6; q = 0.9, delta = 0.01 gives KL = 0.0116).
    - "taylor3": adds the third-order term of B_f around q (our derivation; see
      ``symbolic_gamma``)::

          gamma = q + sqrt(2 delta q (1 - q) / f''(1)) - delta f'''(1) (1 - 2q) / (3 f''(1)^2)

      Approximation; more accurate for small delta, no bound guarantee. Where the cubic term is
      negative (KL: q > 1/2) the form peaks at delta* = a^2 / (4 c^2) (a and c the coefficients of
      sqrt(delta) and delta above) and is held at that peak for larger budgets, so that, like
      every form here, it never decreases as delta grows.
    - "newton": one Newton step on sqrt(B_f) = sqrt(delta) from the Taylor point, its increment t
      saturated smoothly below 1 - q (the start is q + (1 - q)(1 - exp(-t / (1 - q))), so the step
      stays defined), with gamma = 1 where B_f(1; q) <= delta. Approximation; evaluates B_f and its
      derivative once. Non-decreasing in delta for the built-in divergences (checked on a dense
      (q, delta) grid and by a property test; a capped start made reverse KL's dip by 7e-4).
    - "safe": provably never exceeds delta: solves phi(chi2(h || q)) = delta with
      D_f <= phi(chi2) for two-point distributions -- KL <= log(1 + chi2) gives
      gamma = q + sqrt(expm1(delta) q (1 - q)); chi2 and TV are exact; squared Hellinger
      <= chi2; JS <= chi2 / 2; reverse KL <= log(1 + chi2(q || h)) (a quadratic in gamma).
      The float result is rounded towards q, so B_f(gamma; q) <= delta holds for the returned
      float, not only in exact arithmetic. Conservative: for small delta and KL the increment
      is 1/sqrt(2) of the Taylor one.

    For total variation (f''(1) undefined) every method but "safe" returns the exact q + delta.

    Examples
    --------
    >>> round(float(approx_gamma(0.3, 1.0)), 12)          # 0.3 + sqrt(2 * 0.3 * 0.7)
    0.948074069841
    >>> float(approx_gamma(0.3, 1.0, method="safe")) < float(exact_gamma(0.3, 1.0))
    True
    """
    div = get_divergence(divergence)
    if method not in APPROX_METHODS:
        raise ValueError(f"method must be one of {APPROX_METHODS}; got {method!r}")
    scalar = np.ndim(delta) == 0
    q, delta = _inputs(target_prob, delta)
    if method == "taylor" and div.f_second_at_one is not None and scalar and q.size and math.isfinite(delta.flat[0]):
        # Fast path for one finite delta: nothing below needs patching (q (1 - q) >= 0 and
        # q + inc >= q), so the closed form takes five array passes.
        gamma = _taylor_increment(div, q, float(delta.flat[0]))
        gamma += q
        return _scalar_out(np.minimum(gamma, 1.0, out=gamma) if q.ndim else np.minimum(gamma, 1.0))
    with np.errstate(all="ignore"):
        if method == "safe":
            if div.safe_increment_fn is None:
                raise ValueError(f"method='safe' has no proven closed form for divergence {div.name!r}")
            gamma = q + _safe_increment(div, q, delta)
            gamma = np.where(gamma > q, np.nextafter(gamma, -np.inf), q)  # round towards q
            return _scalar_out(np.where(np.isinf(delta) & (q > 0), 1.0, np.clip(gamma, q, 1.0)))
        if div.f_second_at_one is None:
            inc = delta / div.kink
        elif method == "taylor":
            inc = _taylor_increment(div, q, delta)
        elif method == "taylor3":
            if div.f_third_at_one is None:
                raise ValueError(f"method='taylor3' needs f'''(1); divergence {div.name!r} does not define it")
            inc = _taylor3_increment(div, q, delta)
        else:
            inc = _newton_increment(div, q, delta)
        gamma = np.clip(np.where(np.isnan(inc), 0.0, inc) + q, q, 1.0)
        # delta = inf is the limit delta -> inf: 1 where q > 0; at q = 0 the forms stay at 0
        # (sqrt(2 delta q (1 - q)) = 0 for every delta), except TV's q + delta
        gamma = np.where((np.isinf(delta) | np.isinf(inc)) & (q > 0), 1.0, gamma)
        gamma = np.where(delta == 0, q, gamma)
    return _scalar_out(gamma)


def _taylor3_increment(div: FDivergence, q, delta):
    """a sqrt(delta) + c delta with a = sqrt(2 q (1 - q) / f2), c = -f3 (1 - 2q) / (3 f2^2) (f2, f3:
    the second and third derivatives of f at 1), held at its maximum beyond the budget where it
    peaks when c < 0 (delta* = a^2 / (4 c^2)): the cubic term is a small-delta correction, and past
    its peak the form would shrink as the budget grows. So the form is non-decreasing in delta, and
    is the third-order expansion up to delta*."""
    f2, f3 = div.f_second_at_one, div.f_third_at_one
    c = -f3 * (1.0 - 2.0 * q) / (3.0 * f2 * f2)
    a2 = 2.0 * q * (1.0 - q) / f2
    peak = np.where(c < 0, a2 / np.where(c < 0, 4.0 * c * c, 1.0), np.inf)
    held = np.minimum(delta, peak)
    inc = np.sqrt(a2 * held) + c * held
    return np.where(q * (1.0 - q) == 0, 0.0, inc)


def _newton_increment(div: FDivergence, q, delta):
    if div.binary_derivative_fn is None:
        raise ValueError(f"method='newton' needs dB/dgamma; divergence {div.name!r} has none (give f_prime)")
    # the start: the Taylor increment t saturated smoothly below 1 - q, (1 - q)(1 - exp(-t / (1 - q)))
    # (~t for small t), so that it rises with delta without a kink and the step stays defined
    rest = 1.0 - q
    x0 = q + rest * -np.expm1(-_taylor_increment(div, q, delta) / np.where(rest > 0, rest, 1.0))
    b = div.binary(x0, q)
    db = div.binary_derivative(x0 - q, q)
    x1 = x0 - 2.0 * (b - np.sqrt(b * delta)) / db
    x1 = np.where(np.isfinite(x1), x1, x0)
    x1 = np.where(div.binary(np.ones_like(q), q) <= delta, 1.0, x1)
    return np.where(q * (1.0 - q) == 0, 0.0, x1 - q)
