"""Acceptance rules, one module each, behind the protocol of ``_base.Rule``."""

from ._base import GeneralizedRule, Rule, as_rule
from .cactus import Cactus, ExactCactus
from .interpolation import Interpolation
from .lenience import Lenience
from .mentored import Mentored, mentored_target
from .sps import SpS
from .tas import TAS
from .topk import TopK

__all__ = [
    "TAS",
    "Cactus",
    "ExactCactus",
    "GeneralizedRule",
    "Interpolation",
    "Lenience",
    "Mentored",
    "Rule",
    "SpS",
    "TopK",
    "as_rule",
    "mentored_target",
]
