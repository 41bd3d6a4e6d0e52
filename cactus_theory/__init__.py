"""cactus_theory: theory and simulation of speculative-decoding acceptance rules (Cactus, ICLR 2026).

The top level holds what a notebook needs first: the Cactus bonus γ and the divergences, building a rule, its exact
law, and one entry to each decision the toolkit makes. Each family has its own public module with all of its names
(``_FACES``): ``rules``, ``laws``, ``compare``, ``traces``, ``plan``, ``quality``, ``oracle``, ``decode``,
``studies``; and for scripts and extensions ``io``, ``hf``, ``kernels``, ``engines``, ``servers``, ``benchmarks``,
``testing``.

- Which rule should I deploy? ``plan.deployment_frontier`` (``cactus-theory plan --quality RECORDS``).
- Does an engine emit its rule's law? ``oracle.conform`` (``cactus-theory conform``).
- What does a rule buy? ``traces.analyze_trace`` then ``plan.predict_speedup`` (``analyze``; ``calibrate`` then
  ``plan``); what does it cost in answers? ``quality.exact_choice_referee`` (``evaluate --exact``).
"""

from __future__ import annotations

import importlib

from ._math._divergences import (
    FDivergence,
    available_divergences,
    binary_divergence,
    divergence,
    get_divergence,
    register_divergence,
)
from ._math._gamma import APPROX_METHODS, GammaConvergenceWarning, GammaResult, approx_gamma, exact_gamma
from ._math._sampling import SamplingSettings, processed_probs
from ._math._surrogate import cactus_surrogate
from ._rules import Rule, available_rules, make_rule
from ._rules.cactus import Cactus
from ._rules.sps import SpS

__version__ = "0.1.0"

#: The public modules, each a family's names: what a notebook reaches as ``cactus_theory.plan`` (loaded on first use).
_FACES = (
    "rules",
    "laws",
    "compare",
    "traces",
    "plan",
    "quality",
    "oracle",
    "decode",
    "studies",
    "io",
    "hf",
    "kernels",
    "engines",
    "servers",
    "benchmarks",
    "testing",
)
#: Top-level names that are a family's (each documented once, in its family's module): {module: names}.
_SHORTCUTS = {
    "rules": ("Cactus", "SpS", "Rule", "available_rules", "make_rule"),
    "laws": (
        "SamplingSettings",
        "StepMetrics",
        "emitted_distribution",
        "expected_accepted_length",
        "processed_probs",
        "simulate",
        "step_metrics",
    ),
    "traces": ("analyze_trace", "load_trace", "open_traces"),
    "plan": ("CostModel", "deployment_frontier", "predict_speedup"),
    "quality": ("evaluate_rules", "exact_choice_referee"),
    "oracle": ("conform",),
    "decode": ("decode_prompts", "load_model", "speculative_generate"),
    "studies": ("Study", "run_study"),
}
#: The top level's own names: the bonus γ and the divergences (documented at the top of the API reference).
_GAMMA = (
    "APPROX_METHODS",
    "FDivergence",
    "GammaConvergenceWarning",
    "GammaResult",
    "approx_gamma",
    "available_divergences",
    "binary_divergence",
    "cactus_surrogate",
    "divergence",
    "exact_gamma",
    "get_divergence",
    "register_divergence",
)
_SYMBOLIC = ("SYMPY_GENERATORS", "GeneratorFacts", "SymbolicGamma", "generator_facts", "symbolic_gamma")
#: The shortcuts that load a module beyond the wings above on first use: {name: module}.
_LAZY = {
    name: face
    for face, names in _SHORTCUTS.items()
    for name in names
    if name not in ("Cactus", "SpS", "Rule", "available_rules", "make_rule", "SamplingSettings", "processed_probs")
}

__all__ = [*_GAMMA, *_SYMBOLIC, *(name for names in _SHORTCUTS.values() for name in names)]


def __getattr__(name):
    # SymPy takes a third of a second to import, torch seconds: the symbolic API, the families and the shortcuts
    # into them load on first use, so that worker processes and the command line start without them.
    if name in _SYMBOLIC:
        from ._math import _symbolic

        return getattr(_symbolic, name)
    if name in _FACES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cactus_theory' has no attribute {name!r}")


def __dir__():
    return sorted({*__all__, *_FACES, "__version__"})
