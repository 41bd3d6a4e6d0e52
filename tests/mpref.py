"""Independent high-precision references with mpmath (50 digits).

Nothing here imports cactus_theory: the generators are typed from their textbook
definitions and evaluated as written (at 50 digits cancellation is harmless), and gamma* is
found by plain bisection on [q, 1].
"""

from __future__ import annotations

import mpmath as mp

DPS = 50
NAMES = ("kl", "reverse_kl", "chi2", "hellinger", "tv", "js")


def f(name, t):
    """Generator f(t) for t >= 0 (t = 0 by its limit)."""
    t = mp.mpf(t)
    if name == "kl":
        return mp.mpf(0) if t == 0 else t * mp.log(t)
    if name == "reverse_kl":
        return mp.inf if t == 0 else -mp.log(t)
    if name == "chi2":
        return (t - 1) ** 2
    if name == "hellinger":
        return (mp.sqrt(t) - 1) ** 2
    if name == "tv":
        return abs(t - 1) / 2
    if name == "js":
        xlogx = mp.mpf(0) if t == 0 else t * mp.log(t)
        return (xlogx - (1 + t) * mp.log((1 + t) / 2)) / 2
    raise KeyError(name)


SLOPE_AT_INFINITY = {
    "kl": mp.inf,
    "reverse_kl": mp.mpf(0),
    "chi2": mp.inf,
    "hellinger": mp.mpf(1),
    "tv": mp.mpf(1) / 2,
    "js": mp.log(2) / 2,
}


def perspective(name, a, b):
    a, b = mp.mpf(a), mp.mpf(b)
    if b == 0:
        return mp.mpf(0) if a == 0 else a * SLOPE_AT_INFINITY[name]
    return b * f(name, a / b)


def binary(name, gamma, q):
    """B_f(gamma; q) from the float (or mpf) inputs taken exactly, to about 45 significant digits.

    The two terms of B_f are of size ~ |gamma - q| while B_f ~ (gamma - q)^2 / q, so the
    working precision is raised until it covers the cancellation (adaptive, up to 3000 digits).
    """
    g, q = mp.mpf(gamma), mp.mpf(q)
    if g == q:
        return mp.mpf(0)
    dps = DPS
    while True:
        with mp.workdps(dps):
            value = perspective(name, g, q) + perspective(name, 1 - g, 1 - q)
        if value == mp.inf or (value != 0 and DPS - int(mp.log10(abs(value))) <= dps - 10):
            return value
        if dps > 3000:
            raise ArithmeticError(f"B_f({gamma}, {q}) needs more than 3000 digits")
        dps = max(2 * dps, DPS + 10 - int(mp.log10(abs(value)))) if value != 0 else 2 * dps


def gamma_star(name, q, delta):
    """max{gamma in [q, 1]: B_f(gamma; q) <= delta} by bisection, to 45 digits."""
    with mp.workdps(DPS + 330):  # represents q + d exactly for float q and d >= 1e-330 * q
        q, delta = mp.mpf(q), mp.mpf(delta)
        if delta == 0:
            return q
        if q == 1 or binary(name, 1, q) <= delta:
            return mp.mpf(1)
        if q == 0 and SLOPE_AT_INFINITY[name] == mp.inf:
            return mp.mpf(0)  # B(gamma; 0) >= gamma * inf: nothing above 0 is feasible
        # Bisect on the increment d = gamma - q: geometrically while the bracket spans
        # decades (roots can be 1e-108 above a tiny q), then arithmetically to 45 digits.
        lo, hi = mp.mpf(0), 1 - q
        for _ in range(5000):
            if lo == 0:
                mid = hi * mp.mpf(10) ** -8
            elif hi > 4 * lo:
                mid = mp.sqrt(lo * hi)
            else:
                mid = (lo + hi) / 2
            if binary(name, q + mid, q) > delta:
                hi = mid
            else:
                lo = mid
            if hi - lo <= mp.mpf(10) ** (-45) * (q + hi):
                break
        return q + (lo + hi) / 2


def divergence(name, dist, target):
    with mp.workdps(DPS):
        return mp.fsum(perspective(name, a, b) for a, b in zip(dist, target, strict=False))
