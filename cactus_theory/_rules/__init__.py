"""Acceptance rules, one module per family, behind the protocol (``_protocol``) and the registry
(``_registry``).

Importing this package imports every module in it (except the private ones, whose names start
with an underscore), so every rule class defines, and so registers, itself: a new rule is one
new module here and nothing else. ``rule_exports()`` lists what the package exports from them:
each module's ``__all__`` (its rule classes and helpers such as ``mentored_surrogate``).
"""

import importlib
import pkgutil

from .._math._logits import RuleLogits
from ._protocol import (
    BONUS_POLICIES,
    JUDGED,
    RULE_KINDS,
    BlockLaw,
    GeneralizedRule,
    Judgement,
    Rule,
    judgement_of,
    kind_of,
)
from ._registry import (
    ENTRY_POINT_GROUP,
    RuleInfo,
    RulePluginWarning,
    as_rule,
    available_rules,
    builtin_registration,
    load_plugins,
    make_rule,
    make_rules,
    plugin_errors,
)

with builtin_registration():  # the names these modules register are built-in: no plugin takes them
    _MODULES = tuple(
        importlib.import_module(f"{__name__}.{info.name}")
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name)
        if not info.name.startswith("_")
    )


def rule_exports() -> dict:
    """{name: object} of the public names of every rule module of the package (its ``__all__``)."""
    out = {}
    for module in _MODULES:
        for name in getattr(module, "__all__", ()):
            out[name] = getattr(module, name)
    return out


globals().update(rule_exports())

__all__ = [
    "BONUS_POLICIES",
    "ENTRY_POINT_GROUP",
    "JUDGED",
    "RULE_KINDS",
    "Judgement",
    "BlockLaw",
    "GeneralizedRule",
    "Rule",
    "RuleInfo",
    "RuleLogits",
    "RulePluginWarning",
    "as_rule",
    "available_rules",
    "judgement_of",
    "kind_of",
    "load_plugins",
    "make_rule",
    "make_rules",
    "plugin_errors",
    "rule_exports",
    *sorted(rule_exports()),
]
