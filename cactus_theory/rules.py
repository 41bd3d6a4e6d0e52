"""Every registered rule class by its class name, plugins included, with no list to maintain:
``from cactus_theory.rules import Cactus``, ``cactus_theory.rules.SpS``. The same classes are
importable from the top level (``cactus_theory.Cactus``) when they are the package's own.

Beside them, what a rule written elsewhere shares with the package's own: ``block_inputs`` (a block
rule's inputs as checked float64 arrays), ``SpSOneDraft`` (the per-token methods of a block rule
whose one-draft block is SpS: a base before ``Rule``), ``judgement_of`` (what a rule judges)."""

from __future__ import annotations

from ._models._fused import FusedRule
from ._rules import available_rules
from ._rules._helpers import SpSOneDraft, block_inputs
from ._rules._protocol import Judgement, judgement_of

_HELPERS = {
    "FusedRule": FusedRule,
    "SpSOneDraft": SpSOneDraft,
    "block_inputs": block_inputs,
    "Judgement": Judgement,
    "judgement_of": judgement_of,
}


def _classes() -> dict:
    return {info.rule_class.__name__: info.rule_class for info in available_rules().values()}


def __getattr__(name):
    classes = _classes()
    if name in classes:
        return classes[name]
    raise AttributeError(f"no registered rule class {name!r}; the classes: {', '.join(sorted(classes))}")


def __dir__():
    return sorted({*_classes(), *_HELPERS})
