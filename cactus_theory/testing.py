"""The conformance checks every acceptance rule passes (``check_rule``) and every long run keeps
(``check_study``), like scikit-learn's ``check_estimator``, for the rules and studies of this package and for
anyone's.

Each check is a named function over random inputs (raw logits processed with random sampling
settings, so p and q have exact zeros, one-hot rows and ties, and rules that need raw logits get
them). A failure raises an ``AssertionError`` that names the check, the rule and the input that
broke it. The project's own conformance suite is ``check_rule`` over the registry
(``tests/rules/test_conformance.py``).

Examples
--------
>>> from cactus_theory.testing import check_rule
>>> report = check_rule("sps", checks=["probabilities", "emitted_matches_bruteforce"])
>>> report["emitted_matches_bruteforce"]
'passed'
"""

from __future__ import annotations

from ._checks import _conformance
from ._checks._conformance import *  # noqa: F403 (every name of the rules' checks)
from ._checks._studies import STUDY_CHECKS as _STUDY_CHECKS
from ._checks._studies import check_study

#: The study checks by name (name -> function), in the order ``check_study`` runs them.
STUDY_CHECKS = _STUDY_CHECKS
#: The checks by name (name -> function), in the order ``check_rule`` runs them;
#: ``check_rule(rule, checks=[...])`` runs the ones named.
CHECKS = _conformance.CHECKS

__all__ = [*_conformance.__all__, "STUDY_CHECKS", "check_study"]
