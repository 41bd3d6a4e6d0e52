"""The rules: building them (``make_rule``, ``available_rules``), their protocol (``Rule``), and every registered rule
class by its class name, plugins included, with no list to maintain: ``from cactus_theory.rules import Cactus``,
``cactus_theory.rules.TAS``; beside the classes, the helpers each rule module exports (``mentored_surrogate``,
``top_drafts``, ...). ``Cactus`` and ``SpS`` are importable from the top level too.

What a rule written elsewhere shares with the package's own: ``block_inputs`` (a block rule's inputs as checked
float64 arrays), ``SpSOneDraft`` (the per-token methods of a block rule whose one-draft block is SpS: a base before
``Rule``), ``judgement_of`` (what a rule judges); ``FusedRule`` is a rule's torch path compiled."""

from __future__ import annotations

from ._math._logits import RuleLogits
from ._math._vocab import VocabularyMap
from ._models._fused import FusedRule
from ._rules import (
    BONUS_POLICIES,
    ENTRY_POINT_GROUP,
    BlockLaw,
    GeneralizedRule,
    Rule,
    RuleInfo,
    available_rules,
    make_rule,
    make_rules,
    rule_exports,
)
from ._rules._helpers import SpSOneDraft, block_inputs
from ._rules._protocol import Judgement, judgement_of

#: What a rule written elsewhere shares with the package's own.
_HELPERS = {
    "FusedRule": FusedRule,
    "Judgement": Judgement,
    "SpSOneDraft": SpSOneDraft,
    "block_inputs": block_inputs,
    "judgement_of": judgement_of,
}
#: The package's rule classes and their modules' helpers (each rule module's ``__all__``).
_EXPORTS = rule_exports()
globals().update(_EXPORTS)

__all__ = [  # noqa: RUF022 (what every rule shares, then the helpers; the classes are added below)
    "BONUS_POLICIES",
    "BlockLaw",
    "ENTRY_POINT_GROUP",
    "GeneralizedRule",
    "Rule",
    "RuleInfo",
    "RuleLogits",
    "VocabularyMap",
    "available_rules",
    "make_rule",
    "make_rules",
    "FusedRule",
    "Judgement",
    "SpSOneDraft",
    "block_inputs",
    "judgement_of",
]
#: What every rule shares: building, the protocol, raw logits, vocabulary maps.
_SHARED = tuple(__all__[:11])
__all__ += sorted(_EXPORTS)


def _classes() -> dict:
    return {info.rule_class.__name__: info.rule_class for info in available_rules().values()}


def __getattr__(name):
    classes = _classes()  # a plugin's class, registered after this module was imported
    if name in classes:
        return classes[name]
    raise AttributeError(f"no registered rule class {name!r}; the classes: {', '.join(sorted(classes))}")


def __dir__():
    return sorted({*__all__, *_classes()})
