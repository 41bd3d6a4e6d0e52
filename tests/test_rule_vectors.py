"""Every rule of RULES_ZOO.md against the shared test vectors (../shared/data/rule_vectors).

The vectors were computed in float64 from the overlay's formulas (graphcore-research/
relaxed-spec-dec-repro) and rounded to 10 significant digits: emitted laws, bonus laws and
acceptances (where p(n) > 0) must agree to 1e-8, corrections where the rejection mass
p(n) (1 - a(n)) is at least 1e-4 (PROVENANCE.md). Each vector key maps to one registered spec.
"""

import json
import pathlib

import numpy as np
import pytest

from cactus_theory import RuleLogits, make_rule

VECTORS = pathlib.Path(__file__).parents[2] / "shared" / "data" / "rule_vectors" / "vectors.json"
TOL = 1e-8


def _spec(rule, params):
    """(spec string, sampling temperature override, block slot) of a vector setting."""
    join = ";".join
    specs = {
        "strict": lambda: "sps",
        "cactus": lambda: f"cactus(delta={params['delta']})",
        "ensemble": lambda: f"ensemble(verifier_weight={params['verifier_weight']})",
        "always_accept": lambda: "always-accept",
        "rfsd": lambda: f"rfsd(divergence={params['divergence']}, threshold={params['threshold']})",
        "fsd": lambda: f"fsd(divergence={params['divergence']}, threshold={params['threshold']})",
        "spec_cascade_opt": lambda: f"spec-cascade-opt(alpha={params['alpha']}, gate={params['gate']})",
        "spec_cascade_tok3": lambda: f"spec-cascade-tok3(alpha={params['alpha']}, top_set={params['top_set']})",
        "lossy_spec_decode_beta1": lambda: f"lossy(alpha={params['alpha']})",
        "scd_expert_toppk_gated": lambda: f"scd(beta={params['beta']}, temperature={params['scd_temperature']})",
        "scd_alpha": lambda: (
            f"scd(beta={params['beta']}, temperature={params['scd_temperature']}, gate=alpha, "
            f"alpha={params['scd_alpha']})"
        ),
        "synthetic": lambda: f"synthetic(rates=[{join(str(r) for r in params['unconditional_rates'])}])",
    }
    return specs[rule](), params.get("request_temperature"), params.get("position")


def _cases():
    data = json.loads(VECTORS.read_text())
    out = []
    for entry in data["rules"]:
        for setting in entry["settings"]:
            spec, temperature, slot = _spec(entry["rule"], setting["params"])
            out.append(pytest.param(entry, setting, spec, temperature, slot, id=f"{entry['key']}:{spec}"))
    return out


def _floats(values):
    return np.array([-np.inf if v is None else v for v in values], dtype=np.float64)


def test_every_vector_key_maps_to_a_registered_rule():
    keys = {entry["key"] for entry in json.loads(VECTORS.read_text())["rules"]}
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
