"""What a rule costs in answers: the quality referees, each rule's accuracy paired with the verifier alone's on the
same problems. Exact where one token decides (``exact_choice_referee``; any token rule rescored from its records
without a model, ``rescore_exact``), sampled on open answers (``evaluate_rules``; with ``rows``, any token rule at
any m estimated from one pool of answers weighted by their exact likelihoods: ``pooled_from_records``), their
summaries from the records alone, the benchmarks' problems and grades, and the paired statistics."""

from __future__ import annotations

from ._analysis._answer_rows import sequence_log_probs, sequence_rows
from ._analysis._pooled import (
    PooledAccuracy,
    pooled_accuracy,
    pooled_from_records,
    pooled_on_choice_records,
    pooled_table,
)
from ._analysis._referee_summary import (
    ExactSummary,
    QualitySummary,
    read_exact_records,
    read_records,
    summarize_exact,
    summarize_records,
)
from ._analysis._rescore import rescore_exact
from ._data._graders import GRADED, Grade, Problem, grade, load_problems
from ._math._paired import PairedComparison, mcnemar_exact, paired_difference
from ._studies._exact_choice import ExactReferee, exact_choice_referee
from ._studies._quality import SampledReferee, evaluate_rules

__all__ = [
    "GRADED",
    "ExactReferee",
    "ExactSummary",
    "Grade",
    "PairedComparison",
    "PooledAccuracy",
    "Problem",
    "QualitySummary",
    "SampledReferee",
    "evaluate_rules",
    "exact_choice_referee",
    "grade",
    "load_problems",
    "mcnemar_exact",
    "paired_difference",
    "pooled_accuracy",
    "pooled_from_records",
    "pooled_on_choice_records",
    "pooled_table",
    "read_exact_records",
    "read_records",
    "rescore_exact",
    "sequence_log_probs",
    "sequence_rows",
    "summarize_exact",
    "summarize_records",
]
