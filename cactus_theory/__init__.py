"""cactus_theory: theory and simulation of speculative-decoding acceptance rules (Cactus, ICLR 2026)."""

from ._analysis._analyze import AnalysisResult, AnalysisRow, analyze_trace, parse_rules
from ._analysis._batch import BatchResult, batch_requests, simulate_batch, steps_law, verify_budget
from ._analysis._calibrations import default_cost_path
from ._analysis._cost import DEFAULT_COST_PROFILE, CostModel, cost_profiles, fit_to_profiles, load_cost, roofline_cost
from ._analysis._decode_records import (
    answer_drift,
    batch_throughput,
    decoding_flags,
    decoding_summary,
    matched_times,
)
from ._analysis._engines import local_dask_cluster
from ._analysis._plan import Plan, batch_plan, break_even, predict_speedup
from ._analysis._plotting import (
    plot_al_vs_kl,
    plot_delta_sweep,
    plot_delta_sweep_by_task,
    plot_plan,
    plot_rule_front,
    plot_step,
    rule_colours,
)
from ._analysis._roofline import DEVICES, MODEL_PRESETS, DeviceSpec, ModelShape, Roofline
from ._checks._engines import Engine, exact_tested_law
from ._data._graders import GRADED, Grade, Problem, grade, load_problems
from ._data._prompts import (
    Prompt,
    benchmark_file,
    benchmark_prompt,
    data_directory,
    load_prompts,
    mixed_prompts,
    prompt_part,
    prompt_seed,
    select_part,
)
from ._data._trace import Trace, TraceSequence, load_trace
from ._data._trace_format import TraceError
from ._data._trace_import import import_topk_logprobs, trace_from_arrays
from ._data._trace_writer import TraceWriter
from ._data._traceset import TraceSet, embedded_tasks, embedded_traces, merge_traces, open_traces, synthesize_trace
from ._laws._block import BlockLength, block_accepted_length, greedy_draft
from ._laws._emitted import (
    StepMetrics,
    block_statistics,
    block_sums,
    emitted_distribution,
    expected_accepted_length,
    step_metrics,
)
from ._laws._gate import FunctionGate, RegionGate, make_gate
from ._laws._policies import (
    DRAFT_POLICIES,
    LLAMA_DRAFT_READS,
    DraftPolicy,
    make_draft_policy,
    policy_blocks,
    renewal_steps,
)
from ._laws._simulate import SimulationResult, simulate
from ._laws._worst_case import WorstCase, worst_case_drift, worst_case_sweep
from ._math._divergences import (
    FDivergence,
    available_divergences,
    binary_divergence,
    divergence,
    get_divergence,
    register_divergence,
)
from ._math._gamma import APPROX_METHODS, GammaConvergenceWarning, GammaResult, approx_gamma, exact_gamma
from ._math._logits import RuleLogits
from ._math._paired import PairedComparison, mcnemar_exact, paired_difference
from ._math._pareto import pareto_front
from ._math._sampling import SamplingSettings, processed_probs
from ._math._surrogate import cactus_surrogate
from ._math._synthetic import SYNTHETIC_KINDS, synthetic_pairs
from ._math._vocab import VocabularyMap
from ._models._calibrate import calibrate_cost
from ._models._decode_spec import DecodeSpec
from ._models._decoding import (
    DecodeResult,
    NgramDrafter,
    autoregressive_generate,
    autoregressive_generate_batch,
    speculative_generate,
    speculative_generate_batch,
)
from ._models._dump import DumpSummary, dump_trace
from ._models._hf import load_model
from ._models._imports import import_logits
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
from ._servers._calibrate import calibrate_server
from ._servers._conform_engine import LlamaServerEngine
from ._servers._dump import dump_server_trace
from ._servers._protocols import open_server
from ._servers._referee import drive_server
from ._studies._block_study import BlockComparison, compare_block_verification
from ._studies._conform import (
    ConformanceResult,
    ConformanceStudy,
    DecoderEngine,
    choose_contexts,
    conform,
    summarize_conformance,
)
from ._studies._decoding import DecodeStudy, decode_prompts
from ._studies._exact_choice import (
    ExactReferee,
    ExactSummary,
    exact_choice_referee,
    read_exact_records,
    rescore_exact,
    summarize_exact,
)
from ._studies._frontier import Frontier, decide, deployment_frontier, frontier_rules
from ._studies._quality import QualitySummary, SampledReferee, evaluate_rules, read_records, summarize_records
from ._studies._trees import MULTI_DRAFT_METHODS, MultiDraftComparison, compare_multi_draft
from ._studies._zoo import compare_rules, comparison_entries, comparison_markdown, write_comparison
from ._util._results import Result, RowsResult, figure_png
from ._util._study import Study, run_study

__version__ = "0.1.0"

# Every rule class of the package and the helpers its rule modules export (their ``__all__``),
# from the rule modules themselves: a new rule module needs no line here.
_RULE_EXPORTS = rule_exports()
globals().update(_RULE_EXPORTS)

#: The public names by what they are for: the sections of the API reference (docs/api.md), each sorted. The
#: house test checks that every name is documented once, in its section.
_API = {
    "The bonus γ and divergences": (
        "approx_gamma",
        "APPROX_METHODS",
        "available_divergences",
        "binary_divergence",
        "cactus_surrogate",
        "divergence",
        "exact_gamma",
        "FDivergence",
        "GammaConvergenceWarning",
        "GammaResult",
        "generator_facts",
        "GeneratorFacts",
        "get_divergence",
        "register_divergence",
        "symbolic_gamma",
        "SymbolicGamma",
        "SYMPY_GENERATORS",
    ),
    "Rules": (
        "available_rules",
        "BlockLaw",
        "BONUS_POLICIES",
        "ENTRY_POINT_GROUP",
        "GeneralizedRule",
        "make_rule",
        "make_rules",
        "Rule",
        "RuleInfo",
        "RuleLogits",
        "VocabularyMap",
    ),
    "Exact analysis, simulation and worst cases": (
        "block_accepted_length",
        "block_statistics",
        "block_sums",
        "BlockComparison",
        "BlockLength",
        "compare_block_verification",
        "compare_multi_draft",
        "compare_rules",
        "comparison_entries",
        "comparison_markdown",
        "emitted_distribution",
        "expected_accepted_length",
        "FunctionGate",
        "greedy_draft",
        "make_gate",
        "MULTI_DRAFT_METHODS",
        "MultiDraftComparison",
        "pareto_front",
        "plot_al_vs_kl",
        "plot_delta_sweep",
        "plot_delta_sweep_by_task",
        "plot_rule_front",
        "plot_step",
        "RegionGate",
        "rule_colours",
        "simulate",
        "SimulationResult",
        "step_metrics",
        "StepMetrics",
        "SYNTHETIC_KINDS",
        "synthetic_pairs",
        "worst_case_drift",
        "worst_case_sweep",
        "WorstCase",
        "write_comparison",
    ),
    "Batches and GPU costs": (
        "batch_requests",
        "BatchResult",
        "DEVICES",
        "DeviceSpec",
        "fit_to_profiles",
        "MODEL_PRESETS",
        "ModelShape",
        "Roofline",
        "roofline_cost",
        "simulate_batch",
        "steps_law",
        "verify_budget",
    ),
    "Sampling settings": (
        "processed_probs",
        "SamplingSettings",
    ),
    "Traces and their analysis": (
        "AnalysisResult",
        "AnalysisRow",
        "analyze_trace",
        "benchmark_file",
        "benchmark_prompt",
        "data_directory",
        "embedded_tasks",
        "embedded_traces",
        "import_logits",
        "import_topk_logprobs",
        "load_prompts",
        "load_trace",
        "local_dask_cluster",
        "merge_traces",
        "mixed_prompts",
        "open_traces",
        "parse_rules",
        "Prompt",
        "prompt_part",
        "prompt_seed",
        "select_part",
        "synthesize_trace",
        "Trace",
        "trace_from_arrays",
        "TraceError",
        "TraceSequence",
        "TraceSet",
        "TraceWriter",
    ),
    "Predicted speedups": (
        "batch_plan",
        "break_even",
        "calibrate_cost",
        "cost_profiles",
        "CostModel",
        "default_cost_path",
        "DEFAULT_COST_PROFILE",
        "DRAFT_POLICIES",
        "DraftPolicy",
        "LLAMA_DRAFT_READS",
        "load_cost",
        "make_draft_policy",
        "Plan",
        "plot_plan",
        "policy_blocks",
        "predict_speedup",
        "renewal_steps",
    ),
    "Servers: traces, costs and the planner's referee over HTTP": (
        "calibrate_server",
        "drive_server",
        "dump_server_trace",
        "open_server",
    ),
    "Models: dumping traces and real decoding": (
        "answer_drift",
        "autoregressive_generate",
        "autoregressive_generate_batch",
        "batch_throughput",
        "decode_prompts",
        "DecodeResult",
        "DecodeSpec",
        "DecodeStudy",
        "decoding_flags",
        "decoding_summary",
        "dump_trace",
        "DumpSummary",
        "load_model",
        "matched_times",
        "NgramDrafter",
        "speculative_generate",
        "speculative_generate_batch",
    ),
    "Studies: every long run and its result": (
        "figure_png",
        "Result",
        "RowsResult",
        "run_study",
        "Study",
    ),
    "The quality referee: paired accuracy on graded benchmarks": (
        "evaluate_rules",
        "exact_choice_referee",
        "ExactReferee",
        "ExactSummary",
        "Grade",
        "grade",
        "GRADED",
        "load_problems",
        "mcnemar_exact",
        "paired_difference",
        "PairedComparison",
        "Problem",
        "QualitySummary",
        "read_exact_records",
        "read_records",
        "SampledReferee",
        "summarize_exact",
        "summarize_records",
    ),
    "The deployment decision: speed against exact accuracy": (
        "decide",
        "deployment_frontier",
        "Frontier",
        "frontier_rules",
        "rescore_exact",
    ),
    "The oracle for engines": (
        "choose_contexts",
        "conform",
        "ConformanceResult",
        "ConformanceStudy",
        "DecoderEngine",
        "Engine",
        "exact_tested_law",
        "LlamaServerEngine",
        "summarize_conformance",
    ),
}

__all__ = [
    *(name for names in _API.values() for name in names),
    # every rule class of the package and its modules' helpers (the API reference lists them from the registry)
    *sorted(_RULE_EXPORTS),
]

_SYMBOLIC = ("SYMPY_GENERATORS", "GeneratorFacts", "SymbolicGamma", "generator_facts", "symbolic_gamma")


def __getattr__(name):
    # SymPy takes a third of a second to import: the symbolic API loads on first use, so that
    # worker processes and the CLI start without it.
    if name in _SYMBOLIC:
        from ._math import _symbolic

        return getattr(_symbolic, name)
    raise AttributeError(f"module 'cactus_theory' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SYMBOLIC))
