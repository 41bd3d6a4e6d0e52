"""Rule-specific laws (the conformance suite every registered rule passes is test_conformance.py)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from locations import ROOT
from optional import torch
from scipy import optimize, special

from cactus_theory import (
    Cactus,
    SamplingSettings,
    SpS,
    emitted_distribution,
    exact_gamma,
    expected_accepted_length,
    make_rule,
    processed_probs,
    step_metrics,
)
from cactus_theory._laws._emitted import block_sums
from cactus_theory._rules._helpers import NUMPY as _NUMPY
from cactus_theory.laws import synthetic_pairs
from cactus_theory.rules import (
    FSD,
    RFSD,
    SCD,
    TAS,
    Ensemble,
    Interpolation,
    Lenience,
    Lossy,
    Mentored,
    RuleLogits,
    SpecCascadeOpt,
    SpecCascadeTok3,
    SyntheticAcceptance,
    TopK,
    mentored_surrogate,
)


def random_pair(seed, vocab, batch=()):
    rng = np.random.default_rng(seed)
    alpha = rng.choice([0.1, 0.5, 2.0])
    p = rng.dirichlet(np.full(vocab, alpha), size=batch or None)
    q = rng.dirichlet(np.full(vocab, alpha), size=batch or None)
    if rng.random() < 0.3:  # exact zeros in either distribution
        q[..., 0] = 0.0
        q = q / q.sum(axis=-1, keepdims=True)
    if rng.random() < 0.3:
        p[..., -1] = 0.0
        p = p / p.sum(axis=-1, keepdims=True)
    return p, q


# --- rule-specific laws ---------------------------------------------------------------------


@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 40))
def test_sps_emits_the_verifier(seed, vocab):
    p, q = random_pair(seed, vocab, batch=(2,))
    np.testing.assert_allclose(emitted_distribution(SpS(), p, q), q, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bonus", ["taylor", "exact", "safe"])
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 12))
def test_cactus_with_zero_budget_is_sps(bonus, seed, vocab):
    p, q = random_pair(seed, vocab, batch=(2,))
    n = np.array([0, vocab - 1])
    rule = Cactus(0.0, bonus=bonus)
    assert rule.lossless
    np.testing.assert_array_equal(rule.acceptance(p, q, n), SpS().acceptance(p, q, n))
    np.testing.assert_allclose(rule.correction(p, q, n), SpS().correction(p, q, n), rtol=1e-15, atol=1e-300)
    np.testing.assert_allclose(emitted_distribution(rule, p, q), q, atol=1e-12)


@pytest.mark.parametrize(
    "rule", [Cactus(0.01), Cactus(0.5), Cactus(2.0), Cactus(0.01, bonus="exact"), Cactus(1.0, bonus="exact")]
)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 30))
def test_theorem_3_emitted_kl_at_most_draft_kl(rule, seed, vocab):
    p, q = random_pair(seed, vocab)
    pi = emitted_distribution(rule, p, q)
    kl_pi = np.sum(special.rel_entr(pi, q))
    kl_p = np.sum(special.rel_entr(p, q))
    assert kl_pi <= kl_p * (1 + 1e-9) + 1e-12


@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 30), delta=st.floats(1e-4, 3.0))
def test_mentored_emits_its_target_within_budget(seed, vocab, delta):
    p, q = random_pair(seed, vocab)
    h = mentored_surrogate(p, q, delta)
    pi = emitted_distribution(Mentored(delta), p, q)
    np.testing.assert_allclose(pi, h, atol=1e-12)
    kl_h = np.sum(special.rel_entr(h, q))
    kl_p = np.sum(special.rel_entr(p, q))
    assert kl_h <= delta * (1 + 1e-9)
    if kl_p > delta and np.isfinite(kl_p):
        np.testing.assert_allclose(kl_h, delta, rtol=1e-6)
    elif kl_p <= delta:
        np.testing.assert_allclose(h, p, atol=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_mentored_is_optimal_against_a_generic_solver(seed):
    """max sum min(p, h) s.t. KL(h || q) <= delta, solved by SLSQP on (h, t) with t <= p, t <= h."""
    rng = np.random.default_rng(seed)
    vocab, delta = 5, 0.05
    p, q = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
    x0 = np.concatenate([q, np.minimum(p, q)])
    constraints = [
        {"type": "eq", "fun": lambda x: x[:vocab].sum() - 1},
        {"type": "ineq", "fun": lambda x: delta - np.sum(special.rel_entr(np.maximum(x[:vocab], 1e-300), q))},
        {"type": "ineq", "fun": lambda x: p - x[vocab:]},
        {"type": "ineq", "fun": lambda x: x[:vocab] - x[vocab:]},
    ]
    res = optimize.minimize(
        lambda x: -x[vocab:].sum(),
        x0,
        method="SLSQP",
        bounds=[(1e-12, 1)] * (2 * vocab),
        constraints=constraints,
        options={"ftol": 1e-12, "maxiter": 500},
    )
    h = mentored_surrogate(p, q, delta)
    assert np.minimum(p, h).sum() >= -res.fun - 1e-6


def test_tas_threshold_and_correction():
    q = np.array([0.5, 0.3, 0.15, 0.05])
    entropy = -np.sum(q * np.log(q + 1e-5))
    threshold = min(0.09, 0.3 * np.exp(-entropy))
    rule = TAS()
    for n in range(4):
        assert rule.acceptance(np.full(4, 0.25), q, n) == float(q[n] > threshold)
    np.testing.assert_array_equal(rule.correction(np.full(4, 0.25), q, 3), [1.0, 0.0, 0.0, 0.0])


def test_interpolation_emits_its_mixture_and_lenience_one_is_sps():
    p, q = random_pair(2, 8)
    np.testing.assert_allclose(emitted_distribution(Interpolation(0.3), p, q), 0.3 * p + 0.7 * q, atol=1e-14)
    n = np.arange(8)
    pb, qb = np.tile(p, (8, 1)), np.tile(q, (8, 1))
    np.testing.assert_array_equal(Lenience(1.0).acceptance(pb, qb, n), SpS().acceptance(pb, qb, n))


def test_topk_accepts_exactly_the_k_largest():
    q = np.array([0.05, 0.4, 0.1, 0.3, 0.15])
    p = np.full(5, 0.2)
    got = [TopK(2).acceptance(p, q, n) for n in range(5)]
    assert got == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_edge_target_probabilities_zero_and_one():
    p = np.array([0.5, 0.5, 0.0])
    for rule in (Cactus(1.0), Cactus(1.0, bonus="exact")):
        assert rule.acceptance(p, np.array([0.0, 1.0, 0.0]), 0) == 0.0  # q(n) = 0: gamma = 0
        assert rule.acceptance(p, np.array([0.0, 1.0, 0.0]), 1) == 1.0  # q(n) = 1: gamma = 1
        pi = emitted_distribution(rule, p, np.array([0.0, 1.0, 0.0]))
        np.testing.assert_allclose(pi, [0.0, 1.0, 0.0], atol=1e-15)


def test_large_vocabulary_emitted_distribution():
    rng = np.random.default_rng(0)
    vocab = 151_936
    p, q = rng.dirichlet(np.full(vocab, 0.05)), rng.dirichlet(np.full(vocab, 0.05))
    pi = emitted_distribution(Cactus(1.0), p, q)
    np.testing.assert_allclose(pi.sum(), 1.0, rtol=1e-12)
    assert np.all(pi >= 0)


def test_rule_parameters_are_checked():
    with pytest.raises(ValueError, match="delta must be a number >= 0"):
        Cactus(-1.0)
    with pytest.raises(ValueError, match="divergence must be one of"):
        Cactus(0.5, "kullback", bonus="exact")
    with pytest.raises(ValueError, match=r"alpha must lie in \[0, 1\]"):
        Interpolation(1.5)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        TopK(0)
    with pytest.raises(ValueError, match=r"epsilon must lie in \(0, 1\]"):
        TAS(epsilon=0.0)
    with pytest.raises(ValueError, match=r"leniency must lie in \(0, 1\]"):
        Lenience(0.0)
    with pytest.raises(ValueError, match="delta must be a number >= 0"):
        Mentored(-0.1)
    assert Cactus(0.5) == Cactus(0.5) and hash(Cactus(0.5)) == hash(Cactus(0.5))


# --- block statistics and generators ---------------------------------------------------------


@given(beta=st.floats(0, 1), m=st.integers(1, 25))
def test_accepted_length_closed_form(beta, m):
    al = expected_accepted_length(np.full(m + 5, beta), m)
    expected = float(m) if beta == 1 else beta * (1 - beta**m) / (1 - beta)
    np.testing.assert_allclose(al[0], expected, rtol=1e-12, atol=1e-300)


def test_synthetic_pairs_are_seeded_distributions():
    for kind in ("dirichlet", "zipf", "temperature", "noised", "mixture"):
        p, q = synthetic_pairs(kind, n_positions=5, vocab_size=11, seed=4)
        assert p.shape == q.shape == (5, 11)
        np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-14)
        np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-14)
        p2, q2 = synthetic_pairs(kind, n_positions=5, vocab_size=11, seed=4)
        np.testing.assert_array_equal(p, p2)
        np.testing.assert_array_equal(q, q2)
    with pytest.raises(ValueError, match="kind must be one of"):
        synthetic_pairs("uniform")


def test_gamma_worst_case_experiment_runs(tmp_path):
    """The Gamma(delta) script (quick budgets) writes its CSV, table and figure; V = 2 exact is 1."""
    import csv
    import importlib.util

    path = ROOT / "experiments" / "gamma_worst_case.py"
    spec = importlib.util.spec_from_file_location("gamma_worst_case", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.run(deltas=(0.1,), vocabs=(2, 4), n_random=200, n_starts=1, maxiter=5, processes=1, progress=False)
    exact_v2 = next(r for r in rows if r["rule"] == "cactus-exact" and r["vocab"] == 2)
    np.testing.assert_allclose(exact_v2["worst_ratio"], 1.0, rtol=1e-6)
    assert all(r["worst_ratio"] >= r["worst_ratio_random"] for r in rows)
    module.main(["--quick", "--out-dir", str(tmp_path)])
    with open(tmp_path / "gamma_worst_case.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 8
    assert (tmp_path / "gamma_worst_case.png").stat().st_size > 1000


@given(
    beta=st.lists(st.floats(0, 1), min_size=1, max_size=30).map(np.array),
    m=st.integers(1, 40),
)
def test_accepted_length_matches_the_definition(beta, m):
    # AL_t = sum_{k=1}^{m} prod_{j<k} beta_{t+j}, windows truncated at the end (brute force).
    expected = [
        sum(np.prod(beta[t : t + k]) if t + k <= beta.size else 0.0 for k in range(1, m + 1)) for t in range(beta.size)
    ]
    np.testing.assert_allclose(expected_accepted_length(beta, m), expected, rtol=1e-12, atol=1e-300)
    batched = expected_accepted_length(np.stack([beta, beta[::-1]]), m)
    np.testing.assert_allclose(batched[1], expected_accepted_length(beta[::-1], m), rtol=1e-15)


# --- the relaxed rules of the overlay (docs: References): closed forms ------------------------------------------


@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 20), w=st.floats(0, 1))
def test_ensemble_emits_its_mixture(seed, vocab, w):
    p, q = random_pair(seed, vocab)
    np.testing.assert_allclose(emitted_distribution(Ensemble(w), p, q), (1 - w) * p + w * q, atol=1e-14)
    # a token the verifier excludes is accepted with probability 1 - w
    if q[0] == 0 and p[0] > 0:
        np.testing.assert_allclose(Ensemble(w).acceptance(p, q, 0), 1 - w, atol=1e-15)


def test_always_accept_emits_the_drafter():
    rule = make_rule("always-accept")
    assert rule == Ensemble(0.0) and rule.describe() == "always-accept"
    p, q = random_pair(4, 7)
    np.testing.assert_allclose(emitted_distribution(rule, p, q), p, atol=1e-15)
    np.testing.assert_array_equal(rule.acceptance_all(p, q)[p > 0], 1.0)


def _js(p, q):
    m = (p + q) / 2
    return 0.5 * np.sum(special.rel_entr(p, m)) + 0.5 * np.sum(special.rel_entr(q, m))


@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 12), threshold=st.floats(0, 0.7))
def test_fuzzy_rules_emit_the_drafter_or_the_verifier(seed, vocab, threshold):
    p, q = random_pair(seed, vocab)
    d = _js(p, q)  # scipy's rel_entr: an independent JS
    if abs(d - threshold) < 1e-9:
        return
    rfsd, fsd = RFSD("js", threshold), FSD("js", threshold)
    want = p if d <= threshold else q
    np.testing.assert_allclose(emitted_distribution(rfsd, p, q), want, atol=1e-14)
    np.testing.assert_allclose(emitted_distribution(fsd, p, q), want, atol=1e-14)
    # same law, and FSD never accepts more than RFSD (it rejects everything when its gate fails)
    a_r, a_f = step_metrics(rfsd, p, q).acceptance, step_metrics(fsd, p, q).acceptance
    assert a_f <= a_r + 1e-15
    if d > threshold:
        assert a_f == 0


def test_fuzzy_kl_gate_is_verifier_first_and_finite_where_the_drafter_has_no_mass():
    # KL(q || p) with float32-tiny clamps: a token with q > 0 = p adds q (log q + 87.34) (the overlay's rfsd)
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.49, 0.49, 0.02])
    tiny = float(np.finfo(np.float32).tiny)
    d = 0.98 * np.log(0.49 / 0.5) + 0.02 * (np.log(0.02) - np.log(tiny))  # 1.6487, finite
    assert RFSD("kl", d + 1e-9).use_draft(_NUMPY, p, q)
    assert not RFSD("kl", d - 1e-9).use_draft(_NUMPY, p, q)


def test_lossy_example_of_the_spec_emits_the_drafter():
    # the overlay's lossy_spec_decode_beta1: p = (.7, .25, .05), q = (.4, .4, .2), alpha = 0.7 already gives pi = p
    p, q = np.array([0.7, 0.25, 0.05]), np.array([0.4, 0.4, 0.2])
    np.testing.assert_allclose(emitted_distribution(Lossy(0.7), p, q), p, atol=1e-15)
    np.testing.assert_allclose(emitted_distribution(Lossy(0.0), p, q), q, atol=1e-15)


@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 20), alpha=st.floats(0, 0.99))
def test_lossy_closed_form(seed, vocab, alpha):
    p, q = random_pair(seed, vocab)
    kept = np.minimum(p, q / (1 - alpha))
    residual = np.maximum(q - p, 0)
    want = kept + (1 - kept.sum()) * (residual / residual.sum() if residual.sum() > 0 else 0)
    np.testing.assert_allclose(emitted_distribution(Lossy(alpha), p, q), want, atol=1e-13)
    assert np.all(Lossy(alpha).acceptance_all(p, q)[q == 0] == 0)  # never outside the verifier's support


def test_tok3_keeps_the_drafter_on_the_top_set():
    p = np.array([0.1, 0.5, 0.3, 0.1])
    q = np.array([0.6, 0.0, 0.3, 0.1])
    raw = RuleLogits(target=np.log([0.35, 0.3, 0.25, 0.1]))  # before truncation token 1 is close to the top
    rule = SpecCascadeTok3(0.35)  # T = {x : softmax(z)(x) >= 0.65 * 0.35}: tokens 0, 1, 2
    eta = 0.1  # p outside T
    want = np.array([0.1, 0.5, 0.3, 0.0]) + eta * q
    np.testing.assert_allclose(emitted_distribution(rule, p, q, logits=raw), want, atol=1e-15)
    assert rule.acceptance(p, q, 1, logits=raw) == 1.0  # q(1) = 0 but 1 is in T: accepted
    # alpha = 0 keeps only the argmax, the first index on ties
    tie = RuleLogits(target=np.log([0.4, 0.4, 0.1, 0.1]))
    np.testing.assert_allclose(
        SpecCascadeTok3(0.0).surrogate(p, q, logits=tie), np.array([0.1, 0, 0, 0]) + 0.9 * q, atol=1e-15
    )


def test_cascade_opt_defers_by_its_strict_gate():
    p, q = np.array([0.7, 0.3, 0.0]), np.array([0.2, 0.3, 0.5])
    tv = 0.5
    # max p = 0.7 < max q - alpha tv = 0.5 - alpha 0.5 never holds for alpha >= -0.4
    assert not SpecCascadeOpt(0.0).defer(_NUMPY, p, q, None)
    assert SpecCascadeOpt(-0.41).defer(_NUMPY, p, q, None)
    np.testing.assert_allclose(emitted_distribution(SpecCascadeOpt(-0.41), p, q), q, atol=1e-15)
    np.testing.assert_allclose(emitted_distribution(SpecCascadeOpt(-0.39), p, q), p, atol=1e-15)
    assert 0.7 < 0.5 + 0.41 * tv and not 0.7 < 0.5 + 0.39 * tv


def test_scd_without_contrast_at_the_sampling_temperature_is_sps():
    rng = np.random.default_rng(1)
    zq, zp = rng.normal(size=(3, 9)) * 2, rng.normal(size=(3, 9)) * 2
    s = SamplingSettings(temperature=0.6, top_k=5, top_p=0.9)
    p, q = processed_probs(zp, s), processed_probs(zq, s)
    logits = RuleLogits(target=zq, draft=zp, temperature=0.6)
    np.testing.assert_allclose(emitted_distribution(SCD(0.0), p, q, logits=logits), q, atol=1e-14)
    # with contrast: softmax(((1 + b) zq - b zp) / T) on the verifier's support
    beta = 0.5
    score = np.where(q > 0, ((1 + beta) * zq - beta * zp) / 0.6, -np.inf)
    want = special.softmax(score, axis=-1)
    np.testing.assert_allclose(emitted_distribution(SCD(beta), p, q, logits=logits), want, atol=1e-14)


def test_scd_errors_name_what_is_missing():
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.3, 0.7, 0.0])
    with pytest.raises(ValueError, match="needs the sampling temperature"):
        SCD(0.5).acceptance(p, q, 0, logits=RuleLogits(target=np.zeros(3), draft=np.zeros(3)))
    bad = RuleLogits(target=np.zeros(3), draft=np.array([0, -np.inf, 0]), temperature=1)
    with pytest.raises(ValueError, match=r"logits\.draft is not finite on a token of the gate"):
        SCD(0.5).acceptance(p, q, 0, logits=bad)
    with pytest.raises(ValueError, match="needs the target and draft logits"):
        SCD(0.5).acceptance(p, q, 0)
    with pytest.raises(ValueError, match="beta must be a finite number >= 0"):
        SCD(-1.0)


def test_synthetic_rates_give_the_accepted_length():
    rule = SyntheticAcceptance((0.9, 0.6, 0.3))
    assert [rule.at_slot(j).conditional_rate for j in range(4)] == pytest.approx([0.9, 0.6 / 0.9, 0.5, 0.0])
    p, q = synthetic_pairs("dirichlet", n_positions=12, vocab_size=5, seed=0)
    beta = np.stack([step_metrics(rule.at_slot(j), p, q).acceptance for j in range(3)])
    al = block_sums(beta, beta, 3, per_slot=True)
    np.testing.assert_allclose(al[:10], 0.9 + 0.6 + 0.3, rtol=1e-14)  # AL(m) = sum of the rates
    # rejecting n when q is one-hot on n: token 0 (vLLM's no-draft-probabilities residual)
    np.testing.assert_array_equal(rule.correction(np.array([0.5, 0.5]), np.array([0.0, 1.0]), 1), [1.0, 0.0])
    with pytest.raises(ValueError, match="must not increase"):
        SyntheticAcceptance((0.5, 0.9))


def test_safe_cactus_never_overspends_its_budget():
    rng = np.random.default_rng(7)
    q = rng.dirichlet(np.full(30, 0.3), size=200)
    n = rng.integers(30, size=200)
    for delta in (1e-3, 0.1, 2.0):
        h = Cactus(delta, bonus="safe").surrogate(None, q, n)
        kl = np.sum(special.rel_entr(h, q), axis=-1)
        assert np.all(kl <= delta * (1 + 1e-12))


# --- semantics the cross-check left open --------------------------------------------------------


def test_topk_semantics_support_and_authors():
    # the verifier keeps 2 tokens (after its own top-k / top-p); k = 3 > 2: the k-th largest q is 0
    q = np.array([0.7, 0.3, 0.0, 0.0])
    p = np.full(4, 0.25)
    assert TopK(3).acceptance_all(p, q).tolist() == [1, 1, 0, 0]
    assert TopK(3, "authors").acceptance_all(p, q).tolist() == [1, 1, 1, 1]  # MANGA-UOFA/Cactus topk.py
    # ties with the k-th value are all accepted, under both semantics
    q = np.array([0.4, 0.2, 0.2, 0.2])
    assert TopK(2).acceptance_all(p, q).tolist() == [1, 1, 1, 1]
    # the authors' code: accepted = q(n) >= topk(q, k).values[k - 1]
    rng = np.random.default_rng(0)
    for _ in range(50):
        q = rng.dirichlet(np.ones(8)) * (rng.random(8) < 0.5)
        if q.sum() == 0:
            continue
        q /= q.sum()
        kth = np.sort(q)[::-1][2]
        assert TopK(3, "authors").acceptance_all(np.full(8, 1 / 8), q).tolist() == (q >= kth).tolist()


@pytest.mark.parametrize("spec", ["sps", "cactus(delta=1)", "lossy(alpha=0.7)", "mentored(delta=0.01)", "topk(k=2)"])
def test_a_token_neither_model_proposes_is_never_accepted(spec):
    # p(n) = q(n) = 0: rejected; p(n) = 0 < q(n): accepted (the limit of min(1, h(n)/p(n)))
    rule = make_rule(spec)
    p, q = np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.3, 0.3, 0.4, 0.0])
    assert rule.acceptance(p, q, 3) == 0.0
    assert rule.acceptance(p, q, 2) == 1.0


@pytest.mark.torch
def test_processed_probs_keeps_ties_at_the_kth_logit_as_vllm():
    logits = np.log(np.array([0.4, 0.2, 0.2, 0.2]))
    probs = processed_probs(logits, temperature=1.0, top_k=2, top_p=1.0)
    np.testing.assert_allclose(probs, [0.4, 0.2, 0.2, 0.2], atol=1e-15)  # all three tied at the 2nd kept
    t = processed_probs(torch.as_tensor(logits), temperature=1.0, top_k=2, top_p=1.0)
    np.testing.assert_allclose(t.numpy(), probs, atol=1e-15)


@pytest.mark.parametrize("spec", ["cactus(delta=inf)", "cactus-exact(delta=inf)", "cactus(delta=inf, bonus=safe)"])
def test_cactus_with_an_infinite_budget_still_rejects_what_the_verifier_excludes(spec):
    draft = np.array([0.5, 0.3, 0.2, 0.0])
    target = np.array([0.0, 0.5, 0.0, 0.5])
    metrics = step_metrics(make_rule(spec), draft, target)
    assert metrics.acceptance_outside_support == 0.0
    assert metrics.acceptance == pytest.approx(0.3)  # every token with q > 0 is accepted
    assert metrics.kl_emitted_target < np.inf
    assert float(exact_gamma(0.0, np.inf)) == 0.0 and float(exact_gamma(1e-300, np.inf)) == 1.0
    assert float(exact_gamma(0.0, np.inf, "tv")) == 1.0  # TV: B(gamma; 0) = gamma is finite, the limit is 1
