"""cactus_theory: theory and simulation of speculative-decoding acceptance rules (Cactus, ICLR 2026)."""

from ._divergences import (
    FDivergence,
    available_divergences,
    binary_divergence,
    divergence,
    get_divergence,
    register_divergence,
)
from ._emitted import StepMetrics, block_statistics, emitted_distribution, expected_accepted_length, step_metrics
from ._gamma import APPROX_METHODS, GammaResult, approx_gamma, exact_gamma
from ._rules import (
    TAS,
    Cactus,
    ExactCactus,
    GeneralizedRule,
    Interpolation,
    Lenience,
    Mentored,
    Rule,
    SpS,
    TopK,
    mentored_target,
)
from ._simulate import SimulationResult, simulate
from ._symbolic import SYMPY_GENERATORS, GeneratorFacts, SymbolicGamma, generator_facts, symbolic_gamma
from ._synthetic import SYNTHETIC_KINDS, synthetic_pairs
from ._target import cactus_target

__version__ = "0.1.0"

__all__ = [
    "APPROX_METHODS",
    "SYMPY_GENERATORS",
    "SYNTHETIC_KINDS",
    "TAS",
    "Cactus",
    "ExactCactus",
    "FDivergence",
    "GammaResult",
    "GeneralizedRule",
    "GeneratorFacts",
    "Interpolation",
    "Lenience",
    "Mentored",
    "Rule",
    "SimulationResult",
    "SpS",
    "StepMetrics",
    "SymbolicGamma",
    "TopK",
    "approx_gamma",
    "available_divergences",
    "binary_divergence",
    "block_statistics",
    "cactus_target",
    "divergence",
    "emitted_distribution",
    "exact_gamma",
    "expected_accepted_length",
    "generator_facts",
    "get_divergence",
    "mentored_target",
    "register_divergence",
    "simulate",
    "step_metrics",
    "symbolic_gamma",
    "synthetic_pairs",
]
