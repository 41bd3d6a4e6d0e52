"""The conformance suite: every registered rule passes ``cactus_theory.testing.check_rule``
without a line written for it.

The rules under test come from the registry (``conformance_rules``): each spec name at its
defaults, plus every parameter setting its class lists in ``examples``. A rule class that
registers itself is therefore tested here the moment it exists. The input-driven checks run
under hypothesis (a seed per example); the others once. Two registered rules that emit the same
law with the same acceptances on random inputs are refused unless one declares the other
(``same_law_as``): a rule written again under a new name is caught.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory import step_metrics
from cactus_theory._laws._emitted import block_sums
from cactus_theory._rules._registry import _REGISTRY
from cactus_theory.testing import _PER_CASE, CHECKS, check_rule, conformance_rules, make_case, same_rules

RULES = conformance_rules()
IDS = [r.describe() for r in RULES]
ONCE = [c for c in CHECKS if c not in _PER_CASE]


def test_every_registered_name_is_under_test():
    assert {r.family for r in RULES} == set(_REGISTRY)


@pytest.mark.parametrize("check", _PER_CASE)
@pytest.mark.parametrize("rule", RULES, ids=IDS)
@given(seed=st.integers(0, 2**32 - 1))
def test_input_driven_checks(rule, check, seed):
    check_rule(rule, checks=[check], seed=seed, cases=1)


@pytest.mark.parametrize("check", [c for c in ONCE if c != "numpy_torch_agree"])
@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_checks_run_once(rule, check):
    check_rule(rule, checks=[check])


@pytest.mark.torch
@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_numpy_and_torch_agree(rule):
    assert check_rule(rule, checks=["numpy_torch_agree"]) == {"numpy_torch_agree": "passed"}


def given_logits(rule, lg):
    return lg if rule.needs_logits else None


def test_no_two_registered_rules_are_the_same_rule_unless_declared():
    # A rule registered again under another name (Medusa's typical acceptance as a new rule, when
    # tas exists) has the same acceptances and emitted law on every input: refused here.
    assert same_rules(RULES) == [], "registered rules that are one rule (declare same_law_as if on purpose)"


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_block_drift_matches_its_definition(rule):
    # block_sums against the plain double loop over slots (per-slot rates for slot-dependent rules)
    p, q, lg = make_case(2, 7, batch=(9,))
    logits = given_logits(rule, lg)
    m = 3
    slots = [step_metrics(rule.at_slot(j), p, q, logits=logits) for j in range(m + 1)]
    beta = np.stack([s.acceptance for s in slots])
    kl = np.stack([s.kl_emitted_target for s in slots])
    got = block_sums(beta[:m], kl[:m], m, kl[m], per_slot=True)
    for t in range(9):
        reach, want = 1.0, 0.0
        for k in range(m + 1):
            if t + k >= 9:
                break
            want += reach * kl[k][t + k] if reach > 0 else 0.0
            if k < m:
                reach *= beta[k][t + k]
        np.testing.assert_allclose(got[t], want, rtol=1e-12, atol=1e-300)
