"""The front of a trade-off: the points no other point beats on both axes (more accepted, less drift)."""

from __future__ import annotations

__all__ = ["pareto_front"]


def pareto_front(points):
    """Labels of the points (label, AL, drift) that no other point dominates: none has AL >= and
    drift <= with one of them strict. An infinite drift is dominated by any finite one with AL >=.

    Examples
    --------
    >>> pareto_front([("a", 3.0, 0.1), ("b", 2.0, 0.2), ("c", 4.0, 0.5)])
    ['a', 'c']
    """
    front = []
    for label, al, drift in points:
        dominated = any((a >= al and d <= drift and (a > al or d < drift)) for other, a, d in points if other != label)
        if not dominated:
            front.append(label)
    return front
