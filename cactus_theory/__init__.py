"""cactus_theory: theory and simulation of speculative-decoding acceptance rules (Cactus, ICLR 2026)."""

from ._divergences import (
    FDivergence,
    available_divergences,
    binary_divergence,
    divergence,
    get_divergence,
    register_divergence,
)
from ._gamma import APPROX_METHODS, GammaResult, approx_gamma, exact_gamma
from ._symbolic import SYMPY_GENERATORS, GeneratorFacts, SymbolicGamma, generator_facts, symbolic_gamma
from ._target import cactus_target

__version__ = "0.1.0"

__all__ = [
    "APPROX_METHODS",
    "SYMPY_GENERATORS",
    "FDivergence",
    "GammaResult",
    "GeneratorFacts",
    "SymbolicGamma",
    "approx_gamma",
    "available_divergences",
    "binary_divergence",
    "cactus_target",
    "divergence",
    "exact_gamma",
    "generator_facts",
    "get_divergence",
    "register_divergence",
    "symbolic_gamma",
]
