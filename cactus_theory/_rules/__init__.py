"""Acceptance rules, one module per family, behind the protocol and registry of ``_base``.

Importing this package defines (and so registers) every rule.
"""

from ._base import (
    BONUS_POLICIES,
    GeneralizedRule,
    Rule,
    RuleInfo,
    RuleLogits,
    as_rule,
    available_rules,
    make_rule,
    make_rules,
)
from .cactus import Cactus
from .cascades import SpecCascadeOpt, SpecCascadeTok3
from .ensemble import Ensemble
from .fuzzy import FSD, RFSD
from .interpolation import Interpolation
from .lenience import Lenience
from .lossy import Lossy
from .mentored import Mentored, mentored_target
from .scd import SCD
from .sps import SpS
from .synthetic import SyntheticAcceptance
from .tas import TAS
from .topk import TopK

__all__ = [
    "BONUS_POLICIES",
    "FSD",
    "RFSD",
    "SCD",
    "TAS",
    "Cactus",
    "Ensemble",
    "GeneralizedRule",
    "Interpolation",
    "Lenience",
    "Lossy",
    "Mentored",
    "Rule",
    "RuleInfo",
    "RuleLogits",
    "SpS",
    "SpecCascadeOpt",
    "SpecCascadeTok3",
    "SyntheticAcceptance",
    "TopK",
    "as_rule",
    "available_rules",
    "make_rule",
    "make_rules",
    "mentored_target",
]
