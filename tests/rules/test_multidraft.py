"""Multi-draft and tree verification (issue 23) against independent computations: each algorithm
written out as its paper or kernel states it and enumerated over every drafted tuple and coin,
the optimum against a linear program over the tuples, closed forms at one-hot verifiers, and
simulation against the exact tree accepted length."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq, linprog

from cactus_theory import (
    CostModel,
    analyze_trace,
    expected_accepted_length,
    make_rule,
    predict_speedup,
    simulate,
    step_metrics,
)
from cactus_theory._cli import main
from cactus_theory.compare import compare_multi_draft
from cactus_theory.laws import greedy_draft
from cactus_theory.rules import optimal_multi_draft_acceptance
from cactus_theory.traces import trace_from_arrays

DONE_WHEN = (
    "rrs(k=3)",
    "rrs(k=3, replacement=false)",
    "spectr(k=3)",
    "eagle-tree(k=3)",
    "sglang-tree(k=3, threshold_single=1, threshold_acc=1)",
    "multi-draft-optimal(k=3)",
)


def _pair(seed, vocab, zeros=0.2):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.full(vocab, 0.6)), rng.dirichlet(np.full(vocab, 0.6))
    p[rng.random(vocab) < zeros] = 0.0
    q[rng.random(vocab) < zeros] = 0.0
    p[0] += p.sum() == 0
    q[-1] += q.sum() == 0
    return p / p.sum(), q / q.sum()


# --- the algorithms written out, one drafted tuple at a time ----------------------------------


def _rrs_tuple(p, q, drafts, replacement):
    """SpecInfer's recursive rejection sampling of one drafted tuple, step by step: (P(accepted),
    emitted law)."""
    target, left, reach = q.copy(), p.copy(), 1.0
    emitted = np.zeros(len(q))
    for x in drafts:
        prop = p if replacement else left / left.sum()
        a = min(1.0, target[x] / prop[x])
        emitted[x] += reach * a
        reach *= 1 - a
        diff = np.maximum(target - prop, 0.0)
        target = diff / diff.sum() if diff.sum() > 0 else target
        if not replacement:
            left = left.copy()
            left[x] = 0.0
    return 1 - reach, emitted + reach * target


def _draws(p, k, replacement):
    """Every drafted tuple with its probability."""
    support = [int(x) for x in np.flatnonzero(p > 0)]
    if replacement:
        for t in itertools.product(support, repeat=k):
            yield t, float(np.prod(p[list(t)]))
        return
    for t in itertools.permutations(support, min(k, len(support))):
        w, left = 1.0, 1.0
        for x in t:
            w *= p[x] / left
            left -= p[x]
        yield t, w


def _spectr_by_root(p, q, k):
    """SpecTr's k-sequential selection: rho from a root finder (the smallest rho with
    (1 - (1 - beta)^k) / beta <= rho), acceptance 1 - (1 - beta)^k, and its residual."""

    def gap(rho):
        beta = np.minimum(p, q / rho).sum()
        return (1 - (1 - beta) ** k) / beta - rho if beta > 0 else k - rho

    if gap(1.0) <= 0:
        rho = 1.0
    elif gap(float(k)) >= 0:  # c(k) = k to rounding: only the largest rho is feasible
        rho = float(k)
    else:
        rho = brentq(gap, 1.0, float(k), xtol=1e-15)
    beta = np.minimum(p, q / rho).sum()
    return rho, 1 - (1 - beta) ** k


def _lp_optimum(p, q, k):
    """Max-flow of the drafted k-tuples (i.i.d. from p) into q, as a linear program."""
    tuples = list(_draws(p, k, True))
    edges = [(i, y) for i, (t, _) in enumerate(tuples) for y in set(t)]
    a = np.zeros((len(tuples) + len(q), len(edges)))
    for e, (i, y) in enumerate(edges):
        a[i, e] = a[len(tuples) + y, e] = 1
    b = np.concatenate([[w for _, w in tuples], q])
    res = linprog(-np.ones(len(edges)), A_ub=a, b_ub=b, bounds=(0, None), method="highs")
    return -res.fun


def _sglang_exact(q, children, ts, ta):
    """SGLang's TreeSpeculativeSamplingTargetOnly loop for one node, integrated exactly over its
    coin u ~ U(0, 1) (piecewise constant between the breakpoints cum_i / threshold_acc)."""
    cum = np.cumsum(q[children]) / ta
    edges = np.unique(np.clip(np.concatenate([[0.0, 1.0], cum]), 0, 1))
    accepted = np.zeros(len(children))
    for lo, hi in itertools.pairwise(edges):
        u, acc = 0.5 * (lo + hi), 0.0
        for i, x in enumerate(children):
            acc += q[x]
            if u <= acc / ta or q[x] >= ts:
                accepted[i] += hi - lo
                break
    return accepted


# --- the tests ----------------------------------------------------------------------------------


def test_the_issue_specs_build_and_round_trip():
    for spec in DONE_WHEN:
        rule = make_rule(spec)
        assert make_rule(rule.describe()) == rule and rule.draft_count == 3 and rule.kind == "multi-draft"
        assert rule.lossless
    assert make_rule("sglang-tree(k=3, threshold_single=0.5, threshold_acc=1)").lossless is False
    assert make_rule("sps").draft_count == 1


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_rrs_equals_the_algorithm_over_every_drafted_tuple(seed, replacement):
    p, q = _pair(seed, 5)
    for k in (1, 2, 3):
        rule = make_rule(f"rrs(k={k}, replacement={str(replacement).lower()})")
        acc, emitted = 0.0, np.zeros(5)
        for t, w in _draws(p, k, replacement):
            a, e = _rrs_tuple(p, q, t, replacement)
            acc += w * a
            emitted += w * e
        assert float(rule.multi_acceptance(p, q)) == pytest.approx(acc, abs=1e-12)
        np.testing.assert_allclose(emitted, q, atol=1e-12)  # the algorithm is lossless
        np.testing.assert_allclose(step_metrics(rule, p, q).emitted, q, atol=1e-12)


def test_rrs_without_replacement_on_a_wide_row_by_monte_carlo_matches_its_exact_enumeration():
    rule = make_rule("rrs(k=4, replacement=false)")
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(30)), rng.dirichlet(np.ones(30))  # many over-weighted tokens: many prefixes
    exact = float(rule.multi_acceptance(p, q))
    estimate = float(rule._monte_carlo_acceptance(p[None], q[None], draws=4096, seed=1)[0])
    assert estimate == pytest.approx(exact, abs=3e-3)


@pytest.mark.parametrize("seed", range(8))
def test_spectr_matches_a_root_finder_and_its_residual_makes_it_lossless(seed):
    p, q = _pair(seed, 6)
    for k in (1, 2, 4):
        rule = make_rule(f"spectr(k={k})")
        _, acc = _spectr_by_root(p, q, k)
        assert float(rule.multi_acceptance(p, q)) == pytest.approx(acc, abs=1e-12)
        if k <= 2:
            acc_enum, emitted, _ = rule._enumerate(p, q)
            np.testing.assert_allclose(emitted, q, atol=1e-12)
            assert acc_enum == pytest.approx(acc, abs=1e-12)
    # k = 1 is SpS: 1 - TV
    assert float(make_rule("spectr(k=1)").multi_acceptance(p, q)) == pytest.approx(1 - 0.5 * np.abs(p - q).sum())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), vocab=st.integers(2, 5), k=st.integers(1, 3))
def test_optimal_acceptance_is_the_linear_program_and_no_lossless_rule_beats_it(seed, vocab, k):
    p, q = _pair(seed, vocab)
    best = float(optimal_multi_draft_acceptance(p, q, k))
    assert best == pytest.approx(_lp_optimum(p, q, k), abs=1e-9)
    for spec in (f"rrs(k={k})", f"spectr(k={k})"):
        assert float(make_rule(spec).multi_acceptance(p, q)) <= best + 1e-12
    assert float(make_rule(f"multi-draft-optimal(k={k})").multi_acceptance(p, q)) == best


def test_optimal_acceptance_closed_forms():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(7), size=50), rng.dirichlet(np.ones(7), size=50)
    np.testing.assert_allclose(optimal_multi_draft_acceptance(p, q, 1), 1 - 0.5 * np.abs(p - q).sum(-1), atol=1e-14)
    values = np.stack([optimal_multi_draft_acceptance(p, q, k) for k in range(1, 9)])
    assert (np.diff(values, axis=0) >= -1e-14).all()  # more drafts never hurt the optimum
    # a one-hot verifier on y: the best is P(y among k i.i.d. drafts) = 1 - (1 - p(y))^k; so is RRS's
    y = rng.integers(7, size=50)
    onehot = np.eye(7)[y]
    want = 1 - (1 - p[np.arange(50), y]) ** 4
    np.testing.assert_allclose(optimal_multi_draft_acceptance(p, onehot, 4), want, atol=1e-14)
    np.testing.assert_allclose(make_rule("rrs(k=4)").multi_acceptance(p, onehot), want, atol=1e-14)
    # p = q: every draft is right
    np.testing.assert_allclose(optimal_multi_draft_acceptance(p, p, 3), 1.0, atol=1e-14)


def test_optimal_acceptance_on_a_full_vocabulary_in_half_precision():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 151_936)).astype(np.float32) * 3
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs = (probs / probs.sum(-1, keepdims=True)).astype(np.float16)
    rule = make_rule("multi-draft-optimal(k=4)")
    value = step_metrics(rule, probs[0], probs[1]).acceptance
    assert 0 <= value <= 1 and np.isfinite(value)
    # against the optimum of the same rows in float64 (one sort of 152k tokens: the row is not looped over)
    want = optimal_multi_draft_acceptance(
        probs[0].astype(np.float64) / probs[0].astype(np.float64).sum(),
        probs[1].astype(np.float64) / probs[1].astype(np.float64).sum(),
        4,
    )
    assert value == pytest.approx(want, abs=1e-3)


@pytest.mark.parametrize("seed", range(6))
def test_eagle_and_lossless_sglang_are_the_kernels_over_the_top_k_children(seed):
    p, q = _pair(seed, 8)
    children = list(np.argsort(-p, kind="stable")[:3])
    eagle = make_rule("eagle-tree(k=3)")
    assert float(eagle.multi_acceptance(p, q)) == pytest.approx(q[children].sum(), abs=1e-14)
    # EAGLE's loop: accept child x with q'(x), else zero it and renormalise q'
    reach, acc, qq = 1.0, 0.0, q.copy()
    for x in children:
        a = qq[x] / qq.sum() if qq.sum() > 0 else 0.0
        acc += reach * a
        reach *= 1 - a
        qq[x] = 0.0
    assert acc == pytest.approx(q[children].sum(), abs=1e-12)
    sglang = make_rule("sglang-tree(k=3)")
    assert float(sglang.multi_acceptance(p, q)) == pytest.approx(_sglang_exact(q, children, 1, 1).sum(), abs=1e-12)
    np.testing.assert_allclose(sglang.emitted(p, q), q, atol=1e-12)


@pytest.mark.parametrize("thresholds", [(0.5, 0.7), (0.3, 1.0), (1.0, 0.4)])
@pytest.mark.parametrize("seed", range(5))
def test_lossy_sglang_is_its_kernel_integrated_over_the_coin(seed, thresholds):
    ts, ta = thresholds
    p, q = _pair(seed, 7)
    children = list(np.argsort(-p, kind="stable")[:3])
    rule = make_rule(f"sglang-tree(k=3, threshold_single={ts}, threshold_acc={ta})")
    accepted = _sglang_exact(q, children, ts, ta)
    assert float(rule.multi_acceptance(p, q)) == pytest.approx(accepted.sum(), abs=1e-12)
    rest = q.copy()
    rest[children] = 0
    want = (1 - accepted.sum()) * (rest / rest.sum() if rest.sum() > 0 else q)
    np.add.at(want, children, accepted)
    np.testing.assert_allclose(rule.emitted(p, q), want, atol=1e-12)
    # more acceptance than the lossless form, and drift from q when it accepts more
    assert float(rule.multi_acceptance(p, q)) >= float(make_rule("sglang-tree(k=3)").multi_acceptance(p, q)) - 1e-12


def test_the_optimal_coupling_emits_q_and_reaches_the_optimum():
    rule = make_rule("multi-draft-optimal(k=2)")
    for seed in range(4):
        p, q = _pair(seed, 4)
        acc, emitted, _ = rule._enumerate(p, q)
        np.testing.assert_allclose(emitted, q, atol=1e-12)
        assert acc == pytest.approx(float(optimal_multi_draft_acceptance(p, q, 2)), abs=1e-7)


@pytest.mark.parametrize(
    "spec",
    [
        "rrs(k=3)",
        "rrs(k=2, replacement=false)",
        "spectr(k=3)",
        "eagle-tree(k=3)",
        "sglang-tree(k=2, threshold_single=0.5, threshold_acc=0.8)",
        "multi-draft-optimal(k=2)",
    ],
)
def test_simulated_trees_give_the_exact_tree_accepted_length_and_law(spec):
    rule = make_rule(spec)
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.full(5, 0.5), size=12), rng.dirichlet(np.full(5, 0.5), size=12)
    m = 3
    sim = simulate(rule, p, q, m=m, n_runs=5000, seed=2)
    sm = step_metrics(rule, p, q)
    al = expected_accepted_length(sm.acceptance, m)
    diff = sim.accepted - al[sim.block_start]
    assert abs(diff.mean()) < 4.5 * diff.std() / np.sqrt(diff.size)
    seen = sim.drafts > 300
    se = np.sqrt(sm.acceptance[seen] * (1 - sm.acceptance[seen]) / sim.drafts[seen])
    assert (np.abs(sim.acceptance_rate[seen] - sm.acceptance[seen]) < 5 * se + 1e-12).all()
    # the emitted tokens follow the exact law (q for the lossless ones): pooled chi-square
    from scipy import stats

    stat, dof = 0.0, 0
    for counts, law in zip(sim.emitted_counts, sm.emitted, strict=True):
        if counts.sum() < 300:
            continue
        expected = counts.sum() * law
        keep = expected > 5
        stat += (((counts - expected)[keep]) ** 2 / expected[keep]).sum()
        dof += keep.sum() - 1
    assert stats.chi2.sf(stat, dof) > 1e-4
    if rule.lossless:
        np.testing.assert_allclose(sm.emitted, q, atol=1e-12)


def _tiny_trace(tmp_path):
    rng = np.random.default_rng(1)
    target = rng.normal(size=(60, 24)) * 2
    return trace_from_arrays(
        tmp_path / "t",
        target + rng.normal(size=target.shape),
        target,
        rng.integers(0, 24, size=60),
        sequence_lengths=[20, 20, 20],
        top_k=24,
        metadata={"sampling": {"temperature": 1.0, "top_k": 24, "top_p": 1.0}},
    )


def test_analysis_rows_of_trees_and_their_fraction_of_the_optimum(tmp_path):
    trace = _tiny_trace(tmp_path)
    result = analyze_trace(
        trace, ["sps", "rrs(k=4)", "multi-draft-optimal(k=4)", "eagle-tree(k=4)"], ms=(2, 4), n_boot=200
    )
    rows = {(r["rule"], r["m"]): r for r in result.rows if r["task"] == "all"}
    for m in (2, 4):
        sps, rrs, best = rows["sps", m], rows["rrs(k=4)", m], rows["multi-draft-optimal(k=4)", m]
        assert sps["draft_count"] == 1 and sps["verified_tokens"] == m + 1
        assert rrs["draft_count"] == 4 and rrs["verified_tokens"] == 4 * m + 1
        assert sps["acceptance_of_optimum"] == pytest.approx(1.0)  # SpS is the one-draft optimum
        assert best["acceptance_of_optimum"] == pytest.approx(1.0)
        assert rrs["acceptance_of_optimum"] <= 1 + 1e-12 and sps["al"] < rrs["al"] <= best["al"] + 1e-12
    # the tree AL is the prefix product of the per-position acceptance over the drafts, recomputed here
    total, starts = 0.0, 0
    from cactus_theory import SamplingSettings

    for seq in trace.shard(0):
        p, q = seq.distributions(SamplingSettings(temperature=1.0, top_k=24, top_p=1.0))
        beta = np.array([float(optimal_multi_draft_acceptance(p[i], q[i], 4)) for i in range(len(p))])
        al = expected_accepted_length(beta, 4)
        total += al[: len(p) - 3].sum()
        starts += len(p) - 3
    assert rows["multi-draft-optimal(k=4)", 4]["al"] == pytest.approx(total / starts, rel=1e-12)


def test_the_planner_charges_the_verifier_for_the_tree():
    cost = CostModel(draft_token=0.1, verify_block={1: 1.0, 9: 1.4, 33: 3.0})
    rows = [
        {
            "rule": "sps",
            "m": 8,
            "draft_count": 1,
            "verified_tokens": 9,
            "task": "all",
            "al": 5.0,
            "al_lo": 4.0,
            "al_hi": 6.0,
            "kl_emitted_target": 0.0,
        },
        {
            "rule": "rrs(k=4)",
            "m": 8,
            "draft_count": 4,
            "verified_tokens": 33,
            "task": "all",
            "al": 6.0,
            "al_lo": 5.0,
            "al_hi": 7.0,
            "kl_emitted_target": 0.0,
        },
    ]

    class Analysis:
        pass

    analysis = Analysis()
    analysis.rows = rows
    plan = predict_speedup(analysis, cost)
    by = {r["rule"]: r for r in plan.rows}
    assert by["sps"]["step_time"] == pytest.approx(8 * 0.1 + 1.4)
    assert by["rrs(k=4)"]["step_time"] == pytest.approx(8 * 0.1 + 3.0)  # verify(4 * 8 + 1)
    assert by["rrs(k=4)"]["speedup"] == pytest.approx(7 / 3.8)
    assert not by["rrs(k=4)"]["verify_extrapolated"]
    small = CostModel(draft_token=0.1, verify_block={1: 1.0, 9: 1.4})
    plan = predict_speedup(analysis, small)
    assert {r["rule"]: r["verify_extrapolated"] for r in plan.rows} == {"sps": False, "rrs(k=4)": True}
    assert "33 tokens extrapolated" in plan.table()


def test_bad_multi_draft_input_is_refused_by_name():
    with pytest.raises(ValueError, match=r"k \(drafts per position\) must be an integer >= 1"):
        make_rule("rrs(k=0)")
    with pytest.raises(ValueError, match="threshold_acc must lie in"):
        make_rule("sglang-tree(k=2, threshold_acc=0)")
    rule = make_rule("rrs(k=2)")
    p, q = np.array([0.5, 0.5]), np.array([0.2, 0.8])
    with pytest.raises(ValueError, match="drafted_tokens must be 2 integer token ids"):
        rule.verify(p, q, [0])
    with pytest.raises(ValueError, match=r"drafted_tokens must lie in \[0, 2\)"):
        rule.verify(p, q, [0, 2])
    with pytest.raises(ValueError, match="target_probs must sum to 1"):
        rule.multi_acceptance(p, q * 2)
    with pytest.raises(ValueError, match="step_metrics gives its acceptance over the drafts"):
        step_metrics(rule, p, q, 0)
    with pytest.raises(ValueError, match="tree attention is not implemented"):
        from cactus_theory._models._decoding import check_chain_rule

        check_chain_rule(rule)


def test_cli_analyze_compares_a_tree_with_the_optimum_on_the_embedded_trace(capsys):
    assert (
        main(["analyze", "--rules", "rrs(k=4),multi-draft-optimal(k=4)", "--m", "4", "--bootstrap", "0", "--quiet"])
        == 0
    )
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines() if line.startswith(("rrs(k=4)", "multi-draft-optimal(k=4)"))]
    assert lines
    for cells in lines:
        fraction = float(cells[3])
        assert (fraction <= 1.0 + 1e-9) if cells[0].startswith("rrs") else fraction == pytest.approx(1.0)


def test_every_multi_draft_rule_on_a_full_vocabulary_with_top_k_rows():
    from cactus_theory import SamplingSettings, processed_probs

    rng = np.random.default_rng(2)
    target = rng.normal(size=(3, 151_936)).astype(np.float32) * 3
    draft = target + rng.normal(size=target.shape).astype(np.float32)
    settings = SamplingSettings(temperature=0.7, top_k=20, top_p=0.95)
    p, q = processed_probs(draft, settings), processed_probs(target, settings)
    for spec in (*DONE_WHEN, "sglang-tree(k=3, threshold_single=0.5, threshold_acc=0.7)"):
        rule = make_rule(spec)
        sm = step_metrics(rule, p, q)
        assert ((0 <= sm.acceptance) & (sm.acceptance <= 1)).all()
        if rule.lossless:
            assert sm.kl_emitted_target.max() < 1e-12
    # rrs without replacement, compacted to the tokens either model has, is exact here
    rrs = make_rule("rrs(k=3, replacement=false)")
    used = np.flatnonzero((p > 0).any(0) | (q > 0).any(0))
    for row in range(3):
        small_p, small_q = p[row, used], q[row, used]
        assert float(rrs.multi_acceptance(p[row], q[row])) == pytest.approx(
            float(rrs._enumerate(small_p, small_q)[0]), abs=1e-12
        )


# --- the optimum of each drafting scheme (issue 33) ----------------------------------------------


def _scheme_tuples(p, k, drafting):
    """The drafted tuples of a scheme with their probabilities, written out: i.i.d. products,
    sequential draws without replacement (each from the mass left, summed), or the top-k set."""
    if drafting == "top":
        order = sorted(range(len(p)), key=lambda x: (-p[x], x))
        return [(tuple(order[:k]), 1.0)]
    if drafting == "iid":
        return list(_draws(p, k, True))
    support = [int(x) for x in np.flatnonzero(p > 0)]
    out = []
    for t in itertools.permutations(support, min(k, len(support))):
        w = 1.0
        for i, x in enumerate(t):
            w *= p[x] / sum(p[y] for y in support if y not in t[:i])
        out.append((t, w))
    return out


def _max_flow(p, q, k, drafting):
    """The optimal lossless acceptance as the linear program of the coupling: the largest matched
    mass of drafted tuples (capacity their probability) into tokens they hold (capacity q)."""
    tuples = _scheme_tuples(p, k, drafting)
    edges = [(i, y) for i, (t, _) in enumerate(tuples) for y in set(t)]
    a = np.zeros((len(tuples) + len(q), len(edges)))
    for e, (i, y) in enumerate(edges):
        a[i, e] = a[len(tuples) + y, e] = 1
    b = np.concatenate([[w for _, w in tuples], q])
    res = linprog(
        -np.ones(len(edges)),
        A_ub=a,
        b_ub=b,
        bounds=(0, None),
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    return -res.fun


def _min_cut(p, q, k, drafting):
    """1 - max_C [P(every draft in C) - q(C)] over all 2^V token sets C."""
    tuples = _scheme_tuples(p, k, drafting)
    best = 0.0
    for size in range(len(q) + 1):
        for subset in itertools.combinations(range(len(q)), size):
            inside = set(subset)
            best = max(best, sum(w for t, w in tuples if set(t) <= inside) - q[list(subset)].sum())
    return 1.0 - best


@pytest.mark.parametrize("drafting", ["iid", "without-replacement", "top"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_the_optimum_of_each_scheme_is_the_max_flow_and_the_min_cut(drafting, data):
    vocab = data.draw(st.integers(2, 6))
    k = data.draw(st.integers(1, 3))
    seed = data.draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, data.draw(st.sampled_from([0.2, 1.0, 4.0]))))
    q = rng.dirichlet(np.full(vocab, data.draw(st.sampled_from([0.2, 1.0, 4.0]))))
    if data.draw(st.booleans()):  # a token the drafter excludes, and one the verifier excludes
        p[rng.integers(vocab)] = 0.0
        q[rng.integers(vocab)] = 0.0
        p, q = p / p.sum(), q / q.sum()
    ours = float(optimal_multi_draft_acceptance(p, q, k, drafting=drafting))
    assert ours == pytest.approx(_min_cut(p, q, k, drafting), abs=1e-12)
    assert ours == pytest.approx(_max_flow(p, q, k, drafting), abs=1e-8)
    rule = make_rule(f"multi-draft-optimal(k={k}, drafting={drafting})")
    assert float(rule.multi_acceptance(p, q)) == pytest.approx(ours, abs=1e-15)


def test_the_optima_of_the_schemes_in_closed_forms():
    p, q = np.array([0.6, 0.3, 0.1, 0.0]), np.array([0.2, 0.5, 0.1, 0.2])
    # top-k: the fixed set {0, 1} holds q = 0.7; a set of every drafted token holds q(support)
    assert float(optimal_multi_draft_acceptance(p, q, 2, drafting="top")) == pytest.approx(0.7, abs=1e-15)
    assert float(optimal_multi_draft_acceptance(p, q, 3, drafting="top")) == pytest.approx(0.8, abs=1e-15)
    # without replacement from 3 tokens, k >= 3 drafts them all: every y ~ q in the support is matched
    for k in (3, 5):
        assert float(optimal_multi_draft_acceptance(p, q, k, drafting="without-replacement")) == pytest.approx(0.8)
    # one draft: every scheme that samples is 1 - TV
    tv = 0.5 * np.abs(p - q).sum()
    for drafting in ("iid", "without-replacement"):
        assert float(optimal_multi_draft_acceptance(p, q, 1, drafting=drafting)) == pytest.approx(1 - tv, abs=1e-15)
    # k = 2 without replacement, C = {0}: P(both drafts in C) = 0, so the cut is over larger sets:
    # C = {0, 2}: P = 0.6 * 0.1 / 0.4 + 0.1 * 0.6 / 0.9 = 0.21667, minus q(C) = 0.3 -> gain < 0;
    # the optimum is 1 (every y ~ q is matchable) only if no set gains: check by the min cut
    assert float(optimal_multi_draft_acceptance(p, q, 2, drafting="without-replacement")) == pytest.approx(
        _min_cut(p, q, 2, "without-replacement"), abs=1e-12
    )
    with pytest.raises(ValueError, match="drafting must be one of"):
        optimal_multi_draft_acceptance(p, q, 2, drafting="sorted")


def test_without_replacement_past_the_enumeration_is_estimated_and_said_so(monkeypatch):
    from cactus_theory._rules import _optima

    optimal_multi_draft_exactness = _optima.optimal_multi_draft_exactness

    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(9) * 0.7, size=4), rng.dirichlet(np.ones(9) * 0.7, size=4)
    exact = optimal_multi_draft_acceptance(p, q, 3, drafting="without-replacement")
    assert optimal_multi_draft_exactness(p, q, 3, drafting="without-replacement").all()
    monkeypatch.setattr(_optima, "WITHOUT_REPLACEMENT_STATES", 5)
    estimated = optimal_multi_draft_acceptance(p, q, 3, drafting="without-replacement")
    assert not optimal_multi_draft_exactness(p, q, 3, drafting="without-replacement").any()
    # 20,000 seeded tuples: each P(drafts in C) to within a few 1/sqrt(20000) = 0.007
    assert np.abs(estimated - exact).max() < 0.03
    assert not np.array_equal(estimated, exact)


def test_no_lossless_tree_passes_its_own_schemes_optimum_on_the_embedded_trace():
    from cactus_theory.compare import compare_multi_draft

    result = compare_multi_draft(None, ks=(1, 2, 3, 5, 8), ms=(4,), n_boot=100)
    methods = {r["method"] for r in result.rows}
    assert {"optimum (i.i.d.)", "optimum (without replacement)", "optimum (top-k)", "eagle-tree"} <= methods
    for r in result.rows:
        if make_rule(r["rule"]).lossless:
            assert r["acceptance_of_optimum"] <= 1 + 1e-12, r
        if r["method"].startswith("optimum") or r["method"] == "eagle-tree":
            assert r["acceptance_of_optimum"] == pytest.approx(1.0, abs=1e-12), r  # the top-k optimum is q(S)
    # distinct drafts never do worse than i.i.d. ones: P(k draws without replacement in C) <= p(C)^k
    best = {(r["method"], r["k"]): r["acceptance"] for r in result.rows}
    for k in (1, 2, 3, 5, 8):
        assert best["optimum (without replacement)", k] >= best["optimum (i.i.d.)", k] - 1e-12


def test_the_optimum_without_replacement_for_k_at_least_the_rows_support_is_immediate():
    """Issue 43, item 8: optimal_multi_draft_acceptance(V=3, k=10**7, without-replacement) ran past 60 s. A row of
    s tokens drafts them all once k >= s: every draft lies in C exactly when C holds p's support S, so the optimum
    is 1 - max(0, max_{C ⊇ S} (1 - q(C))) = q(S)."""
    p = np.array([[0.6, 0.4, 0.0], [0.5, 0.3, 0.2]])
    q = np.array([[0.2, 0.2, 0.6], [0.1, 0.1, 0.8]])
    for k in (3, 50, 10**7):
        got = optimal_multi_draft_acceptance(p, q, k, drafting="without-replacement")
        np.testing.assert_allclose(got, [0.4, 1.0], rtol=0, atol=1e-15)
    # below the support it is the enumeration's: k = 2 of the 3-token row, by brute force over C
    two = optimal_multi_draft_acceptance(p[1], q[1], 2, drafting="without-replacement")
    pairs = {}
    for a, b in itertools.permutations(range(3), 2):
        pairs[frozenset((a, b))] = pairs.get(frozenset((a, b)), 0.0) + p[1, a] * p[1, b] / (1 - p[1, a])
    best = max(
        sum(w for s, w in pairs.items() if s <= set(c)) - q[1, list(c)].sum()
        for r in range(4)
        for c in itertools.combinations(range(3), r)
    )
    assert two == pytest.approx(1 - max(best, 0.0), abs=1e-12)


def test_optimal_multi_draft_acceptance_and_greedy_draft_check_their_inputs():
    p, q = np.array([0.5, 0.5]), np.array([0.2, 0.8])
    for k in (0, -1, 2.5, float("nan"), True):
        with pytest.raises(ValueError, match=r"k \(drafts per position\) must be an integer >= 1"):
            optimal_multi_draft_acceptance(p, q, k)
    for bad, name in ((3 * p, "draft_probs"), (p - 0.4, "draft_probs"), (np.array([np.nan, 1.0]), "draft_probs")):
        with pytest.raises(ValueError, match=name):
            optimal_multi_draft_acceptance(bad, q, 2)
    with pytest.raises(ValueError, match="target_probs"):
        optimal_multi_draft_acceptance(p, np.array([0.2, 0.2]), 2)
    with pytest.raises(ValueError, match="differ"):
        optimal_multi_draft_acceptance(p, np.array([0.2, 0.3, 0.5]), 2)
    for bad in ([[np.nan, 0.9]], [[0.5, 0.6]], [[-0.1, 1.1]]):
        with pytest.raises(ValueError, match="draft_probs"):
            greedy_draft(bad)


def test_a_huge_tree_width_is_refused_with_the_reason():
    for spec in ("rrs(k=1000000000)", "spectr(k=5000)", "eagle-tree(k=100000)"):
        with pytest.raises(ValueError, match=r"more than the 1024 supported: a step verifies k m \+ 1 tokens"):
            make_rule(spec)
    with pytest.raises(ValueError, match="1024 supported"):
        compare_multi_draft(None, ks=(10**9,), ms=(2,), n_boot=0)
