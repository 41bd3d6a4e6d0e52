"""cactus_theory: theory and simulation of speculative-decoding acceptance rules (Cactus, ICLR 2026)."""

from ._analysis import AnalysisResult, analyze_trace, parse_rules
from ._decode import DecodeResult, NgramDrafter, autoregressive_generate, speculative_generate
from ._divergences import (
    FDivergence,
    available_divergences,
    binary_divergence,
    divergence,
    get_divergence,
    register_divergence,
)
from ._dump import dump_trace, load_model
from ._emitted import StepMetrics, block_statistics, emitted_distribution, expected_accepted_length, step_metrics
from ._gamma import APPROX_METHODS, GammaResult, approx_gamma, exact_gamma
from ._plotting import plot_step
from ._prompts import Prompt, load_prompts, mixed_prompts
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
from ._sampling import SamplingSettings, processed_probs
from ._simulate import SimulationResult, simulate
from ._symbolic import SYMPY_GENERATORS, GeneratorFacts, SymbolicGamma, generator_facts, symbolic_gamma
from ._synthetic import SYNTHETIC_KINDS, synthetic_pairs
from ._target import cactus_target
from ._trace import (
    Trace,
    TraceError,
    TraceSequence,
    TraceWriter,
    import_logits,
    import_topk_logprobs,
    load_trace,
    trace_from_arrays,
)
from ._worst_case import WorstCase, worst_case_drift

__version__ = "0.1.0"

__all__ = [
    "APPROX_METHODS",
    "SYMPY_GENERATORS",
    "SYNTHETIC_KINDS",
    "TAS",
    "AnalysisResult",
    "Cactus",
    "DecodeResult",
    "ExactCactus",
    "FDivergence",
    "GammaResult",
    "GeneralizedRule",
    "GeneratorFacts",
    "Interpolation",
    "Lenience",
    "Mentored",
    "NgramDrafter",
    "Prompt",
    "Rule",
    "SamplingSettings",
    "SimulationResult",
    "SpS",
    "StepMetrics",
    "SymbolicGamma",
    "TopK",
    "Trace",
    "TraceError",
    "TraceSequence",
    "TraceWriter",
    "WorstCase",
    "analyze_trace",
    "approx_gamma",
    "autoregressive_generate",
    "available_divergences",
    "binary_divergence",
    "block_statistics",
    "cactus_target",
    "divergence",
    "dump_trace",
    "emitted_distribution",
    "exact_gamma",
    "expected_accepted_length",
    "generator_facts",
    "get_divergence",
    "import_logits",
    "import_topk_logprobs",
    "load_model",
    "load_prompts",
    "load_trace",
    "mentored_target",
    "mixed_prompts",
    "parse_rules",
    "plot_step",
    "processed_probs",
    "register_divergence",
    "simulate",
    "speculative_generate",
    "step_metrics",
    "symbolic_gamma",
    "synthetic_pairs",
    "trace_from_arrays",
    "worst_case_drift",
]
