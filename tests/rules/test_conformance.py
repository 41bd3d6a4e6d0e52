"""The conformance suite: every registered rule passes ``cactus_theory.testing.check_rule``
without a line written for it.

The rules under test come from the registry (``conformance_rules``): each spec name at its
defaults, plus every parameter setting its class lists in ``examples``. A rule class that
registers itself is therefore tested here the moment it exists. The input-driven checks run
under hypothesis (a seed per example); the others once. Two registered rules that emit the same
law with the same acceptances on random inputs are refused unless one declares the other
(``same_law_as``): a rule written again under a new name is caught.
"""

import json

import numpy as np
import pytest
from children import run_with_module
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory import step_metrics
from cactus_theory._checks._conformance import _PER_CASE
from cactus_theory._laws._emitted import block_sums
from cactus_theory._rules._registry import _REGISTRY
from cactus_theory.testing import CHECKS, check_rule, conformance_rules, make_case, same_rules

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


NAN_RULES = '''
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cactus_theory.rules import GeneralizedRule, MultiDraftRule, BlockVerification, MultiDraftLaw


@dataclass(frozen=True)
class NanRule(GeneralizedRule):
    """Every number NaN."""

    name: ClassVar[str] = "nan-rule"

    def _surrogate(self, b, p, q, n, lg):
        return q * np.nan

    def _acceptance(self, b, p, q, n, lg):
        return b.take_last(q, n) * np.nan

    def emitted(self, draft_probs, target_probs, *, logits=None):
        return np.asarray(target_probs, dtype=float) * np.nan

    def _acceptance_all(self, p, q, lg):
        return p * np.nan


@dataclass(frozen=True)
class NanLossless(NanRule):
    """NaN and claiming to be lossless."""

    name: ClassVar[str] = "nan-lossless"
    lossless: ClassVar[bool] = True


@dataclass(frozen=True)
class NanMulti(MultiDraftRule):
    """A multi-draft rule whose numbers are NaN."""

    name: ClassVar[str] = "nan-multi"
    lossless: ClassVar[bool] = True

    def _verify(self, p, q, drafts):
        return MultiDraftLaw(np.full(self.k + 1, np.nan), q * np.nan)

    def multi_acceptance(self, draft_probs, target_probs):
        return np.full(np.shape(target_probs)[:-1], np.nan)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        return np.asarray(target_probs, dtype=float) * np.nan


@dataclass(frozen=True)
class NanBlock(BlockVerification):
    """A block rule whose block law is NaN."""

    name: ClassVar[str] = "nan-block"

    def block_law(self, draft_probs, target_probs, drafted_tokens, *, logits=None):
        law = super().block_law(draft_probs, target_probs, drafted_tokens, logits=logits)
        return type(law)(accepted=law.accepted * np.nan, emitted=law.emitted)
'''


def test_every_check_fails_on_rules_whose_numbers_are_nan(tmp_path):
    out = run_with_module(
        tmp_path,
        NAN_RULES,
        """
        import json
        import broken_rules
        from cactus_theory.testing import CHECKS, check_rule
        report = {}
        for spec in ("nan-rule", "nan-lossless", "nan-multi(k=2)", "nan-block"):
            for name in CHECKS:
                try:
                    check_rule(spec, checks=[name], cases=2)
                except AssertionError as exc:
                    report[f"{spec}:{name}"] = "failed" if "not finite" in str(exc) or "nan" in str(exc).lower() \\
                        else "failed: " + str(exc)[:200]
                else:
                    report[f"{spec}:{name}"] = "passed"
        print(json.dumps(report))
        """,
    )
    report = json.loads(out.strip().splitlines()[-1])
    passed = sorted(k for k, v in report.items() if v == "passed")
    assert passed == [], passed
    assert all(v == "failed" for v in report.values()), report


def test_check_rule_refuses_a_zero_case_count_and_no_checks():
    from cactus_theory.testing import check_rule

    for cases in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="cases must be an integer >= 1"):
            check_rule("sps", cases=cases)
    with pytest.raises(ValueError, match="checks is empty"):
        check_rule("sps", checks=[])


#: One wrong rule per check: (the check, a module defining the rule, its spec). Each check must
#: catch its wrong rule (and a correct rule passes it: the conformance suite).
WRONG = {
    "probabilities": """
@dataclass(frozen=True)
class Wrong(SpS):
    name: ClassVar[str] = "wrong"
    lossless: ClassVar[bool] = False
    def correction(self, draft_probs, target_probs, drafted_token, *, logits=None, validate=True):
        r = super().correction(draft_probs, target_probs, drafted_token, logits=logits, validate=validate)
        return r * 0.5
""",
    "bonus_laws": """
@dataclass(frozen=True)
class Wrong(Lossy):
    name: ClassVar[str] = "wrong"
    def bonus_distribution(self, draft_probs, target_probs, *, policy="verifier", logits=None, validate=True):
        return np.asarray(target_probs, dtype=float)
""",
    "acceptance_all": """
@dataclass(frozen=True)
class Wrong(Lossy):
    name: ClassVar[str] = "wrong"
    def _acceptance_all(self, p, q, lg):
        return super()._acceptance_all(p, q, lg) * 0.9
""",
    "emitted_matches_bruteforce": """
@dataclass(frozen=True)
class Wrong(Lossy):
    name: ClassVar[str] = "wrong"
    def emitted(self, draft_probs, target_probs, *, logits=None):
        return np.asarray(target_probs, dtype=float)
""",
    "lossless": """
@dataclass(frozen=True)
class Wrong(Lossy):
    name: ClassVar[str] = "wrong"
    lossless: ClassVar[bool] = True
""",
    "drafter_without_probabilities": """
@dataclass(frozen=True)
class Wrong(Lossy):
    name: ClassVar[str] = "wrong"
    def acceptance(self, draft_probs, target_probs, drafted_token, *, logits=None, validate=True):
        a = super().acceptance(draft_probs, target_probs, drafted_token, logits=logits, validate=validate)
        return a * 0.5 if draft_probs is None else a
""",
    "bad_input": """
@dataclass(frozen=True)
class Wrong(Lossy):
    name: ClassVar[str] = "wrong"
    def acceptance(self, draft_probs, target_probs, drafted_token, *, logits=None, validate=True):
        return super().acceptance(draft_probs, target_probs, drafted_token, logits=logits, validate=False)
""",
    "spec_round_trip": """
@dataclass(frozen=True)
class Wrong(Lossy):
    name: ClassVar[str] = "wrong"
    def describe(self):
        return "wrong"
""",
    "monte_carlo": """
@dataclass(frozen=True)
class Wrong(Lossy):
    name: ClassVar[str] = "wrong"
    def emitted(self, draft_probs, target_probs, *, logits=None):
        p, q = np.asarray(draft_probs, dtype=float), np.asarray(target_probs, dtype=float)
        return 0.5 * (p + q)
""",
    "numpy_torch_agree": """
@dataclass(frozen=True)
class Wrong(Lossy):
    name: ClassVar[str] = "wrong"
    def _surrogate(self, b, p, q, n, lg):
        h = super()._surrogate(b, p, q, n, lg)
        return h if b.name == "numpy" else 0.5 * (h + q)
""",
    "block_lossless": """
@dataclass(frozen=True)
class Wrong(Lossy):
    name: ClassVar[str] = "wrong"
    lossless: ClassVar[bool] = True
""",
    "block_at_least_token": """
@dataclass(frozen=True)
class Wrong(BlockVerification):
    name: ClassVar[str] = "wrong"
    def expected_block_lengths_for(self, p, q, ms, **kw):
        out = super().expected_block_lengths_for(p, q, ms, **kw)
        return {m: (used, values * 0.8, errors) for m, (used, values, errors) in out.items()}
""",
    "block_monte_carlo": """
@dataclass(frozen=True)
class Wrong(BlockVerification):
    name: ClassVar[str] = "wrong"
    def expected_block_lengths_for(self, p, q, ms, **kw):
        out = super().expected_block_lengths_for(p, q, ms, **kw)
        return {m: (used, values * 1.2 + 0.05, errors) for m, (used, values, errors) in out.items()}
""",
    "block_survival": """
@dataclass(frozen=True)
class Wrong(BlockVerification):
    name: ClassVar[str] = "wrong"
    def block_survival_for(self, p, q, ms, **kw):
        out = super().block_survival_for(p, q, ms, **kw)
        return {m: (used, values, errors, survival[:, ::-1]) for m, (used, values, errors, survival) in out.items()}
""",
    "multi_verify": """
@dataclass(frozen=True)
class Wrong(RecursiveRejectionSampling):
    name: ClassVar[str] = "wrong"
    def _verify(self, p, q, drafts):
        law = super()._verify(p, q, drafts)
        return MultiDraftLaw(law.accepted * 0.5, law.emitted)
""",
    "multi_enumeration": """
@dataclass(frozen=True)
class Wrong(RecursiveRejectionSampling):
    name: ClassVar[str] = "wrong"
    def multi_acceptance(self, draft_probs, target_probs):
        return super().multi_acceptance(draft_probs, target_probs) * 0.9
""",
    "multi_below_optimum": """
@dataclass(frozen=True)
class Wrong(RecursiveRejectionSampling):
    name: ClassVar[str] = "wrong"
    def multi_acceptance(self, draft_probs, target_probs):
        return np.minimum(1.0, super().multi_acceptance(draft_probs, target_probs) * 1.5 + 0.05)
""",
    "multi_single_draft": """
@dataclass(frozen=True)
class Wrong(RecursiveRejectionSampling):
    name: ClassVar[str] = "wrong"
    def single(self):
        return Lenience(0.5)
""",
}


_HEADER = """
from dataclasses import dataclass
from typing import ClassVar
import numpy as np
from cactus_theory.rules import (SpS, Lossy, Lenience, BlockVerification, RecursiveRejectionSampling, MultiDraftLaw)
"""


def test_each_check_catches_a_rule_with_the_wrong_law_and_the_check_list_is_covered(tmp_path):
    from cactus_theory.testing import CHECKS

    assert set(WRONG) == set(CHECKS)
    (tmp_path / "broken_rules.py").write_text(_HEADER)
    out = run_with_module(
        tmp_path,
        _HEADER,
        f"""
        import json, types
        from cactus_theory.testing import check_rule
        from cactus_theory._rules import _registry
        cases = {json.dumps(WRONG)}
        report = {{}}
        for check, body in cases.items():
            _registry._REGISTRY.pop("wrong", None)
            module = types.ModuleType(f"wrong_{{check}}")
            exec(open("broken_rules.py").read() + body, module.__dict__)
            spec = "wrong(k=2)" if "Recursive" in body else "wrong(alpha=0.3)" if "Lossy" in body else "wrong"
            try:
                check_rule(spec, checks=[check], cases=3)
            except AssertionError as exc:
                report[check] = "caught" if f": {{check}} " in str(exc) else "other: " + str(exc)[:300]
            else:
                report[check] = "passed"
        print(json.dumps(report))
        """,
    )
    report = json.loads(out.strip().splitlines()[-1])
    assert all(v == "caught" for v in report.values()), {k: v for k, v in report.items() if v != "caught"}
