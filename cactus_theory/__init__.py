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

__version__ = "0.1.0"

__all__ = [
    "APPROX_METHODS",
    "FDivergence",
    "GammaResult",
    "approx_gamma",
    "available_divergences",
    "binary_divergence",
    "divergence",
    "exact_gamma",
    "get_divergence",
    "register_divergence",
]
