"""The exact laws of the rules: the emitted distribution and its drift per step (``step_metrics``), accepted lengths
of token and block rules, Monte Carlo that agrees with them (``simulate``), the worst drift of a step (Γ(δ):
``worst_case_drift``), gates, drafting policies and the steps decoding takes, synthetic pairs, Pareto fronts, and the
sampling settings every law is computed under (``SamplingSettings``, ``processed_probs``); the exact probability
that speculative decoding emits a given answer (``answer_log_prob``) and worlds of answers whose accuracy under any
rule is enumerable (``AnswerWorld``)."""

from __future__ import annotations

from ._laws._answer_law import answer_log_prob, answer_step_factors
from ._laws._answer_worlds import AnswerWorld
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
from ._math._pareto import pareto_front
from ._math._sampling import SamplingSettings, processed_probs
from ._math._synthetic import SYNTHETIC_KINDS, synthetic_pairs

__all__ = [
    "DRAFT_POLICIES",
    "LLAMA_DRAFT_READS",
    "SYNTHETIC_KINDS",
    "AnswerWorld",
    "BlockLength",
    "DraftPolicy",
    "FunctionGate",
    "RegionGate",
    "SamplingSettings",
    "SimulationResult",
    "StepMetrics",
    "WorstCase",
    "answer_log_prob",
    "answer_step_factors",
    "block_accepted_length",
    "block_statistics",
    "block_sums",
    "emitted_distribution",
    "expected_accepted_length",
    "greedy_draft",
    "make_draft_policy",
    "make_gate",
    "pareto_front",
    "policy_blocks",
    "processed_probs",
    "renewal_steps",
    "simulate",
    "step_metrics",
    "synthetic_pairs",
    "worst_case_drift",
    "worst_case_sweep",
]
