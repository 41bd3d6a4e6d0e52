"""Every relaxed rule of the overlay against its test vectors (tests/fixtures/rule_vectors).

The vectors were computed in float64 from the formulas of graphcore-research/relaxed-spec-dec-repro
@ c28353f and rounded to 10 significant digits: emitted laws, bonus laws and acceptances (where
p(n) > 0) must agree to 1e-8, corrections where the rejection mass p(n) (1 - a(n)) is at least
1e-4 (PROVENANCE.md beside the data). Each setting names the spec string of the rule it tests.
"""

import gzip
import json

import numpy as np
import pytest
from locations import FIXTURES

from cactus_theory import make_rule
from cactus_theory.rules import RuleLogits

VECTORS = FIXTURES / "rule_vectors" / "vectors.json.gz"
TOL = 1e-8


def _load():
    with gzip.open(VECTORS, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _cases():
    out = []
    for entry in _load()["rules"]:
        for setting in entry["settings"]:
            spec, temperature, slot = setting["spec"], setting["temperature"], setting["slot"]
            out.append(pytest.param(entry, setting, spec, temperature, slot, id=f"{entry['key']}:{spec}"))
    return out


def _floats(values):
    return np.array([-np.inf if v is None else v for v in values], dtype=np.float64)


def test_every_vector_key_maps_to_a_registered_rule():
    keys = {entry["key"] for entry in _load()["rules"]}
    assert len(keys) == 15
    assert len(_cases()) == 28


@pytest.mark.parametrize(("entry", "setting", "spec", "temperature", "slot"), _cases())
def test_rule_agrees_with_the_vectors(entry, setting, spec, temperature, slot):
    rule = make_rule(spec)
    if slot is not None:
        rule = rule.at_slot(slot)
    checked = 0
    for case, out in zip(entry["inputs"], setting["outputs"], strict=True):
        p, q = np.array(case["p"]), np.array(case["q"])
        p, q = p / p.sum(), q / q.sum()  # undo the 10-digit rounding
        logits = None
        if "logits" in case:
            raw = case["logits"]
            logits = RuleLogits(
                target=_floats(raw["zq_rule"]),
                draft=_floats(raw["zp_rule"]),
                temperature=temperature if temperature is not None else case["processing"]["temperature"],
            )
        accept = rule.acceptance_all(p, q, logits=logits)
        np.testing.assert_allclose(np.where(p > 0, accept, 0.0), np.where(p > 0, out["accept"], 0.0), atol=TOL)
        np.testing.assert_allclose(rule.emitted(p, q, logits=logits), out["emitted"], atol=TOL)
        np.testing.assert_allclose(rule.bonus_distribution(p, q), out["bonus_target_p"], atol=TOL)
        if out["bonus_relaxed_T_qp"] is not None:
            relaxed = rule.bonus_distribution(p, q, policy="relaxed", logits=logits)
            np.testing.assert_allclose(relaxed, out["bonus_relaxed_T_qp"], atol=TOL)
        if out["h"] is not None and hasattr(rule, "target") and not getattr(rule, "surrogate_depends_on_token", True):
            np.testing.assert_allclose(rule.surrogate(p, q, logits=logits), out["h"], atol=TOL)
        if out["correction"] is not None:
            for n in np.flatnonzero(p * (1.0 - accept) >= 1e-4):
                np.testing.assert_allclose(rule.correction(p, q, int(n), logits=logits), out["correction"][n], atol=TOL)
                checked += 1
    assert checked > 0 or entry["rule"] in ("always_accept",)
