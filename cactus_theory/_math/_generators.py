"""The generators f(t) of the registered divergences as SymPy reads them (strings in t, no SymPy
imported here): the divergences' registry records each one (``FDivergence.sympy_generator``) and
the symbolic derivations read them, so neither imports the other."""

from __future__ import annotations

__all__ = ["GENERATORS", "record"]

#: {divergence name: f(t) as a SymPy string}, for every registered divergence that has one.
GENERATORS: dict[str, str] = {}


def record(name: str, text: str | None) -> None:
    """Record (or, for None, forget) the generator of divergence ``name``."""
    if text is None:
        GENERATORS.pop(name, None)
    else:
        GENERATORS[name] = text
