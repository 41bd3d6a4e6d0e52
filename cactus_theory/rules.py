"""Every registered rule class by its class name, plugins included, with no list to maintain:
``from cactus_theory.rules import Cactus``, ``cactus_theory.rules.SpS``. The same classes are
importable from the top level (``cactus_theory.Cactus``) when they are the package's own."""

from __future__ import annotations

from ._rules import available_rules


def _classes() -> dict:
    return {info.rule_class.__name__: info.rule_class for info in available_rules().values()}


def __getattr__(name):
    classes = _classes()
    if name in classes:
        return classes[name]
    raise AttributeError(f"no registered rule class {name!r}; the classes: {', '.join(sorted(classes))}")


def __dir__():
    return sorted(_classes())
