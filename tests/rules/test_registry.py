"""The rule registry: spec strings, grids, errors that list the valid choices, self-registration,
and the analysis of the embedded trace with rules named on the command line."""

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
from locations import ROOT

from cactus_theory import (
    Cactus,
    SamplingSettings,
    analyze_trace,
    available_rules,
    load_trace,
    make_rule,
    processed_probs,
    step_metrics,
)
from cactus_theory._cli import main
from cactus_theory._rules._registry import _REGISTRY
from cactus_theory.rules import RFSD, GeneralizedRule, Lossy, RuleLogits, SpecCascadeOpt, SpecCascadeTok3, make_rules
from cactus_theory.traces import trace_from_arrays

ISSUE_NAMES = {
    "sps",
    "tas",
    "topk",
    "cactus",
    "cactus-exact",
    "mentored",
    "interpolation",
    "lenience",
    "ensemble",
    "always-accept",
    "rfsd",
    "fsd",
    "spec-cascade-opt",
    "spec-cascade-tok3",
    "lossy",
    "scd",
    "synthetic",
}


def test_every_rule_of_the_literature_is_registered_with_its_parameters():
    rules = available_rules()
    assert ISSUE_NAMES <= set(rules)
    assert rules["rfsd"].parameters == {"divergence": "js", "threshold": 0.2}
    assert rules["scd"].parameters == {"beta": 0.5, "temperature": None, "gate": "toppk", "alpha": 0.1}
    assert rules["cactus-exact"].fixed == {"bonus": "exact"} and "bonus" not in rules["cactus-exact"].parameters
    assert rules["always-accept"].signature() == "always-accept"


def test_spec_strings_build_the_rules():
    assert make_rule("cactus(delta=1)") == Cactus(1.0)
    assert make_rule("cactus-exact(delta=0.5, divergence=hellinger)") == Cactus(0.5, "hellinger", bonus="exact")
    assert make_rule("rfsd(divergence=js, threshold=0.2)") == RFSD("js", 0.2)
    assert make_rule(" lossy( alpha = 0.7 ) ") == Lossy(0.7)
    assert make_rule("spec_cascade_opt(alpha=-0.1, gate='paper')") == SpecCascadeOpt(-0.1, "paper")
    assert make_rule("synthetic(rates=[0.9; 0.6])").rates == (0.9, 0.6)
    assert make_rule("scd(beta=1, temperature=none)").temperature is None


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("speculative", r"unknown rule 'speculative'.*registered rules: always-accept, block, cactus"),
        ("cactus(delat=1)", r"rule 'cactus' has no parameter 'delat'.*its parameters: delta, divergence, bonus"),
        ("cactus-exact(bonus=taylor)", r"no parameter 'bonus'.*its parameters: delta, divergence"),
        ("cactus(delta=abc)", r"delta='abc' is not a number"),
        ("cactus(delta=1", r"unbalanced brackets|not of the form"),
        ("cactus(delta=1, delta=2)", r"delta is given twice"),
        ("cactus(1)", r"argument '1' must be key=value"),
        ("lossy(alpha=1)", r"alpha must lie in \[0, 1\)"),
        ("topk(k=2, semantics=vllm)", r"semantics must be one of"),
    ],
)
def test_bad_specs_say_what_is_valid(spec, match):
    with pytest.raises(ValueError, match=match):
        make_rule(spec)


def test_grid_expands_the_rules_that_have_the_parameter():
    rules = make_rules("sps,cactus,mentored(delta=2),lossy(alpha=0.3)", {"delta": [0.25, 1.0]})
    assert [r.describe() for r in rules] == [
        "sps",
        "cactus(delta=0.25)",
        "cactus(delta=1)",
        "mentored(delta=2)",
        "lossy(alpha=0.3)",
    ]
    with pytest.raises(ValueError, match="no rules given"):
        make_rules("", {"delta": [1.0]})


def test_a_new_rule_registers_itself_and_is_built_from_its_spec():
    try:

        @dataclasses.dataclass(frozen=True)
        class Halfway(GeneralizedRule):
            """Generalised SpS halfway between the verifier and uniform."""

            weight: float = 0.5
            name: ClassVar[str] = "halfway-test"

            def _surrogate(self, b, p, q, n, lg):
                return q * (1 - self.weight) + self.weight / b.shape(q)[-1]

        rule = make_rule("halfway-test(weight=0.25)")
        assert rule == Halfway(0.25) and rule.describe() == "halfway-test(weight=0.25)"
        assert "halfway-test" in available_rules()
        with pytest.raises(ValueError, match="rule name 'sps' is taken"):

            @dataclasses.dataclass(frozen=True)
            class Impostor(GeneralizedRule):
                name: ClassVar[str] = "sps"
    finally:
        _REGISTRY.pop("halfway-test", None)


def test_cli_lists_the_rules(capsys):
    assert main(["rules"]) == 0
    out = capsys.readouterr().out
    for name in ISSUE_NAMES:
        assert name in out
    assert "rfsd(divergence=js, threshold=0.2)" in out


def test_cli_analyses_the_embedded_trace_with_spec_strings(capsys):
    rules = "rfsd(divergence=js, threshold=0.2),lossy(alpha=0.7)"
    assert main(["analyze", "--rules", rules, "--m", "8", "--bootstrap", "0", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "rfsd(divergence=js, threshold=0.2)" in out and "lossy(alpha=0.7)" in out
    assert main(["analyze", "--rules", "cactus(delat=1)", "--quiet"]) == 2
    assert "its parameters: delta, divergence, bonus" in capsys.readouterr().err


def test_trace_logits_are_the_stored_ones_with_bounds_elsewhere(tmp_path):
    rng = np.random.default_rng(0)
    vocab, n = 300, 12
    target = rng.normal(size=(n, vocab)) * 3
    draft = target * 0.5 + rng.normal(size=(n, vocab)) * 2
    trace = trace_from_arrays(tmp_path / "t", draft, target, rng.integers(vocab, size=n), top_k=16)
    seq = trace[0]
    settings = SamplingSettings(temperature=0.6, top_k=8, top_p=0.95)
    p, q, lg = seq.distributions(settings, with_logits=True)
    ids = np.concatenate([seq.topk_ids["target"], seq.topk_ids["draft"]], axis=-1)
    for role, full in (("target", target), ("draft", draft)):
        true = np.take_along_axis(full, ids, axis=-1)
        known = getattr(lg, f"{role}_known")
        z = getattr(lg, role)
        finite = np.isfinite(z)  # repeated ids are -inf (probability 0 in both models)
        np.testing.assert_allclose(z[known & finite], true[known & finite], rtol=1e-6)
        assert np.all(z[~known] >= true[~known] - 1e-5)  # unknown entries hold upper bounds
        lse = np.log(np.exp(full - full.max(-1, keepdims=True)).sum(-1)) + full.max(-1)
        np.testing.assert_allclose(getattr(lg, f"{role}_lse"), lse, rtol=1e-12)
        outside = np.ones_like(full, dtype=bool)
        np.put_along_axis(outside, ids, False, axis=-1)
        assert np.all(getattr(lg, f"{role}_floor")[:, None] >= np.where(outside, full, -np.inf) - 1e-5)
    # the paper OPT gate and the Tok3 top set on the trace agree with full rows where marked exact
    p_full, q_full = processed_probs(draft, settings), processed_probs(target, settings)
    full_lg = RuleLogits(target=target, draft=draft, temperature=0.6)
    for rule in (SpecCascadeOpt(0.0, "paper"), SpecCascadeTok3(0.35), SpecCascadeTok3(0.8)):
        exact = rule.logits_exact(p, q, logits=lg)
        a_trace = step_metrics(rule, p, q, logits=lg).acceptance
        a_full = step_metrics(rule, p_full, q_full, logits=full_lg).acceptance
        np.testing.assert_allclose(a_trace[exact], a_full[exact], rtol=1e-6)
        assert exact.any()


def test_analysis_of_every_rule_family_on_a_small_trace(tmp_path):
    rng = np.random.default_rng(2)
    vocab, n = 200, 40
    target = rng.normal(size=(n, vocab)) * 3
    draft = target * 0.7 + rng.normal(size=(n, vocab)) * 1.5
    trace = trace_from_arrays(
        tmp_path / "t",
        draft,
        target,
        rng.integers(vocab, size=n),
        sequence_lengths=[25, 15],
        top_k=32,
        metadata={"sampling": SamplingSettings().as_dict()},
    )
    specs = [info.signature() for info in available_rules().values() if not info.rule_class.kind == "block"]
    result = analyze_trace(trace, specs, ms=(2, 4), n_boot=0, progress=False, bonus_policy="relaxed")
    rows = {r["rule"]: r for r in result.rows if r["task"] == "unknown" and r["m"] == 4}
    assert len(rows) == len(specs)
    assert rows["sps"]["kl_per_token"] < 1e-12 and rows["sps"]["acceptance_outside_support"] == 0
    assert rows["always-accept"]["acceptance"] == pytest.approx(1.0)
    assert 0 < rows["always-accept"]["acceptance_outside_support"] < 1
    assert rows["synthetic(rates=[0.9;0.6;0.3])"]["al"] == pytest.approx(0.9 + 0.6 + 0.3)
    assert all(0 <= r["logits_exact"] <= 1 for r in rows.values())


def test_per_token_drift_against_a_direct_walk(tmp_path):
    """kl_per_token: expected drift of the tokens a block emits over the tokens it emits, direct."""
    rng = np.random.default_rng(5)
    vocab, n, m = 60, 30, 3
    target = rng.normal(size=(n, vocab)) * 2
    draft = target + rng.normal(size=(n, vocab))
    trace = trace_from_arrays(tmp_path / "t", draft, target, rng.integers(vocab, size=n), top_k=32)
    s = SamplingSettings()
    for policy in ("verifier", "relaxed"):
        result = analyze_trace(
            trace, ["cactus(delta=1)"], ms=(m,), settings=s, n_boot=0, progress=False, bonus_policy=policy
        )
        row = next(r for r in result.rows if r["task"] == "all")
        p, q = trace[0].distributions(s)
        sm = step_metrics(Cactus(1.0), p, q)
        drift, tokens = 0.0, 0.0
        for t in range(n - m + 1):
            reach = 1.0
            for k in range(m):
                drift += reach * sm.kl_emitted_target[t + k]
                tokens += reach * sm.acceptance[t + k]
                reach *= sm.acceptance[t + k]
            if policy == "relaxed" and t + m < n:
                drift += reach * sm.kl_emitted_target[t + m]
            tokens += 1.0
        np.testing.assert_allclose(row["kl_per_token"], drift / tokens, rtol=1e-12)


def test_embedded_trace_rules_outside_the_support():
    trace = load_trace()
    seq = trace[0]
    p, q = seq.distributions(SamplingSettings(**trace.metadata["sampling"]))
    for spec, outside in (("sps", False), ("cactus(delta=10)", False), ("always-accept", True), ("ensemble", True)):
        got = step_metrics(make_rule(spec), p, q).acceptance_outside_support.sum()
        assert (got > 0) == outside, spec


def test_every_public_name_is_on_the_api_page():
    # the API page lists every top-level name and what every rule shares, at the top or in its family's module;
    # rule modules' exports come from the registry (docs/conf.py)
    import re

    import cactus_theory
    from cactus_theory import rules

    page = open(ROOT / "docs" / "api.md", encoding="utf-8").read()
    listed = {name.rsplit(".", 1)[-1] for name in re.findall(r"::\s+(cactus_theory\.[\w.]+)", page)}
    missing = sorted((set(cactus_theory.__all__) | set(rules._SHARED)) - listed - set(rules._EXPORTS))
    assert not missing, f"add these to docs/api.md: {missing}"


def test_the_delta_grid_reaches_only_rules_whose_delta_is_a_divergence_budget(capsys):
    rules = make_rules("relaxed-topk,cactus,mentored,sps", {"delta": [0.25, 2.0]})
    assert [r.describe() for r in rules] == [
        "relaxed-topk(top_n=10, delta=0.6)",
        "cactus(delta=0.25)",
        "cactus(delta=2)",
        "mentored(delta=0.25)",
        "mentored(delta=2)",
        "sps",
    ]
    assert main(["analyze", "--rules", "relaxed-topk", "--m", "4", "--bootstrap", "0", "--quiet"]) == 0
    assert "relaxed-topk(top_n=10, delta=0.6)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    assert "(cactus, cactus-exact, mentored)" in " ".join(capsys.readouterr().out.split())


def test_list_parameters_refuse_nesting_of_any_depth():
    for spec in ("synthetic(rates=[[[0.5]]])", "synthetic(rates=[0.5;[0.2]])", "synthetic(rates=[(0.5)])"):
        with pytest.raises(ValueError, match="nests lists"):
            make_rule(spec)
    assert make_rule("synthetic(rates=[0.5;0.2])").rates == (0.5, 0.2)
