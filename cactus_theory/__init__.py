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
from ._servers._dump import dump_server_trace
from ._servers._protocols import open_server
from ._servers._referee import drive_server
from ._studies._block_study import BlockComparison, compare_block_verification
from ._studies._decoding import DecodeStudy, decode_prompts
from ._studies._exact_choice import (
    ExactReferee,
    ExactSummary,
    exact_choice_referee,
    read_exact_records,
    summarize_exact,
)
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

__all__ = [
    "APPROX_METHODS",
    "BONUS_POLICIES",
    "DEFAULT_COST_PROFILE",
    "DEVICES",
    "DRAFT_POLICIES",
    "ENTRY_POINT_GROUP",
    "MODEL_PRESETS",
    "MULTI_DRAFT_METHODS",
    "SYMPY_GENERATORS",
    "SYNTHETIC_KINDS",
    "AnalysisResult",
    "AnalysisRow",
    "BatchResult",
    "BlockComparison",
    "BlockLaw",
    "BlockLength",
    "CostModel",
    "DecodeResult",
    "DecodeSpec",
    "DeviceSpec",
    "DraftPolicy",
    "FDivergence",
    "FunctionGate",
    "GammaConvergenceWarning",
    "GammaResult",
    "GeneralizedRule",
    "GeneratorFacts",
    "ModelShape",
    "MultiDraftComparison",
    "NgramDrafter",
    "Plan",
    "Prompt",
    "RegionGate",
    "Roofline",
    "Rule",
    "RuleInfo",
    "RuleLogits",
    "SamplingSettings",
    "SimulationResult",
    "StepMetrics",
    "SymbolicGamma",
    "Trace",
    "TraceError",
    "TraceSequence",
    "TraceSet",
    "TraceWriter",
    "VocabularyMap",
    "WorstCase",
    *sorted(_RULE_EXPORTS),
    "analyze_trace",
    "answer_drift",
    "approx_gamma",
    "autoregressive_generate",
    "autoregressive_generate_batch",
    "available_divergences",
    "available_rules",
    "batch_plan",
    "batch_requests",
    "batch_throughput",
    "benchmark_file",
    "benchmark_prompt",
    "binary_divergence",
    "block_accepted_length",
    "block_statistics",
    "block_sums",
    "break_even",
    "cactus_surrogate",
    "calibrate_cost",
    "compare_block_verification",
    "compare_multi_draft",
    "compare_rules",
    "comparison_entries",
    "comparison_markdown",
    "cost_profiles",
    "data_directory",
    "DecodeStudy",
    "decode_prompts",
    "decoding_flags",
    "decoding_summary",
    "default_cost_path",
    "divergence",
    "DumpSummary",
    "GRADED",
    "Grade",
    "PairedComparison",
    "Problem",
    "QualitySummary",
    "ExactSummary",
    "evaluate_rules",
    "exact_choice_referee",
    "read_exact_records",
    "read_records",
    "summarize_exact",
    "ExactReferee",
    "SampledReferee",
    "Result",
    "RowsResult",
    "Study",
    "run_study",
    "grade",
    "load_problems",
    "mcnemar_exact",
    "paired_difference",
    "summarize_records",
    "dump_trace",
    "embedded_tasks",
    "embedded_traces",
    "emitted_distribution",
    "exact_gamma",
    "expected_accepted_length",
    "figure_png",
    "fit_to_profiles",
    "generator_facts",
    "get_divergence",
    "greedy_draft",
    "import_logits",
    "import_topk_logprobs",
    "load_cost",
    "load_model",
    "load_prompts",
    "load_trace",
    "local_dask_cluster",
    "make_draft_policy",
    "make_gate",
    "make_rule",
    "make_rules",
    "matched_times",
    "merge_traces",
    "mixed_prompts",
    "open_traces",
    "pareto_front",
    "parse_rules",
    "plot_al_vs_kl",
    "plot_delta_sweep",
    "plot_delta_sweep_by_task",
    "plot_plan",
    "plot_rule_front",
    "plot_step",
    "policy_blocks",
    "renewal_steps",
    "LLAMA_DRAFT_READS",
    "dump_server_trace",
    "open_server",
    "calibrate_server",
    "drive_server",
    "predict_speedup",
    "processed_probs",
    "prompt_part",
    "prompt_seed",
    "register_divergence",
    "roofline_cost",
    "rule_colours",
    "select_part",
    "simulate",
    "simulate_batch",
    "speculative_generate",
    "speculative_generate_batch",
    "step_metrics",
    "steps_law",
    "symbolic_gamma",
    "synthesize_trace",
    "synthetic_pairs",
    "trace_from_arrays",
    "verify_budget",
    "worst_case_drift",
    "worst_case_sweep",
    "write_comparison",
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
