"""pooled_accuracy: any rule's accuracy from one pool of answers weighted by exact likelihoods, checked against
worlds whose accuracy is enumerable (AnswerWorld) and against the estimator computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from cactus_theory._analysis._pooled import pooled_accuracy
from cactus_theory._laws._answer_worlds import AnswerWorld

DECODED = {"verifier alone": None, "sps": "sps", "cactus(delta=1)": "cactus(delta=1)"}
RESCORED = {"cactus(delta=4)": "cactus(delta=4)", "lossy(alpha=0.5)": "lossy(alpha=0.5)", "tas": "tas"}


def test_intervals_cover_the_exact_difference_over_200_worlds():
    # each world: 60 Markov problems (3 tokens, answers of 4); 50 drawn with replacement and answered once by
    # each decoded method; the truth is the exact mean over the 60 (enumerated), for lossless and lossy rules,
    # decoded or only rescored
    m, drawn, worlds = 2, 50, 200
    covered, errors = {}, {}
    for seed in range(worlds):
        world = AnswerWorld(60, vocab=3, length=4, seed=seed)
        truth = {label: world.accuracy(method, m).mean() for label, method in {**DECODED, **RESCORED}.items()}
        rng = np.random.default_rng(10_000 + seed)
        chosen = rng.integers(0, world.problems, drawn)
        problem, by, grade, log_probs = world.pool(chosen, DECODED, RESCORED, m, rng)
        rows = pooled_accuracy(problem, by, grade, log_probs, list(log_probs), n_boot=500, seed=seed)
        for r in rows:
            assert r.estimate == "pooled"
            want = truth[r.method] - truth["verifier alone"]
            covered.setdefault(r.method, []).append(r.difference_lo - 1e-12 <= want <= r.difference_hi + 1e-12)
            covered.setdefault(r.method + " accuracy", []).append(r.accuracy_lo <= truth[r.method] <= r.accuracy_hi)
            errors.setdefault(r.method, []).append(r.difference - want)
    for label, hits in covered.items():
        # 95% nominal: over 200 worlds a coverage below 0.90 is 3 standard errors short
        assert np.mean(hits) >= 0.90, (label, np.mean(hits))
    for label, err in errors.items():
        err = np.asarray(err)
        assert abs(err.mean()) <= 3 * err.std() / np.sqrt(worlds) + 1e-12, (label, err.mean())
    # a lossless rule's weights are the verifier's: its difference is 0 in every world, exactly up to rounding
    assert np.max(np.abs(errors["sps"])) < 1e-12


def test_the_estimate_by_hand():
    # two problems, two methods with one answer each; A decoded by "a", B by "b"
    # problem 0: P_a = (0.5, 0.25) and P_b = (0.25, 0.5) of its answers (A, B), P_r = (0.5, 0.5), grades (1, 0)
    # problem 1: P_a = (0.2, 0.2), P_b = (0.2, 0.2), P_r = (0.1, 0.3), grades (0, 1)
    problem = [0, 0, 1, 1]
    by = ["a", "b", "a", "b"]
    grade = [1, 0, 0, 1]
    lp = {
        "a": np.log([0.5, 0.25, 0.2, 0.2]),
        "b": np.log([0.25, 0.5, 0.2, 0.2]),
        "r": np.log([0.5, 0.5, 0.1, 0.3]),
    }
    # weights w = P_r / (P_a + P_b): problem 0: 0.5/0.75 each; problem 1: 0.1/0.4, 0.3/0.4
    w = np.array([[2 / 3, 2 / 3], [0.25, 0.75]])
    s = np.array([2 / 3, 0.75])  # the correct answers' weights
    big_w = w.sum(1)  # 4/3, 1
    beta = np.cov(s, big_w, bias=True)[0, 1] / np.var(big_w)
    want_r = s.mean() - beta * (big_w.mean() - 1)
    # the reference "a": w = P_a / (P_a + P_b): (2/3, 1/3) and (1/2, 1/2); S = (2/3, 1/2), W = (1, 1): beta = 0
    want_a = (2 / 3 + 0.5) / 2
    rows = pooled_accuracy(problem, by, grade, lp, ["r"], reference="a", n_boot=200)
    assert [r.method for r in rows] == ["a", "r"]
    assert rows[0].accuracy == pytest.approx(want_a, abs=1e-15)
    assert rows[1].accuracy == pytest.approx(want_r, abs=1e-15)
    assert rows[1].difference == pytest.approx(want_r - want_a, abs=1e-15)
    assert rows[1].mean_weight == pytest.approx(big_w.mean(), abs=1e-15)
    ess = sum(x.sum() ** 2 / (x**2).sum() for x in w)
    assert rows[1].ess == pytest.approx(ess, abs=1e-13)


def test_a_rule_the_pool_hardly_sees_falls_back_or_is_refused():
    rng = np.random.default_rng(1)
    n = 40
    problem = np.repeat(np.arange(n), 2)
    by = np.tile(["verifier alone", "far"], n)
    grade = rng.integers(0, 2, 2 * n).astype(float)
    common = np.log(rng.uniform(0.05, 0.2, 2 * n))
    far = np.where(by == "far", common, common - 30.0)  # "far" emits its own answers, the verifier's hardly ever
    log_probs = {"verifier alone": np.where(by == "far", common - 30.0, common), "far": far, "unseen": far.copy()}
    log_probs["unseen"][::2] = -np.inf
    rows = {r.method: r for r in pooled_accuracy(problem, by, grade, log_probs, ["far", "unseen"], min_ess=1.5)}
    assert rows["far"].estimate == "own answers" and "own answers" in rows["far"].reason
    assert rows["far"].accuracy == pytest.approx(grade[by == "far"].mean())
    paired = grade[by == "far"] - grade[by == "verifier alone"]
    assert rows["far"].difference == pytest.approx(paired.mean())
    assert rows["far"].difference_lo < paired.mean() < rows["far"].difference_hi
    assert rows["unseen"].estimate == "refused" and np.isnan(rows["unseen"].accuracy)
    assert "never decoded" in rows["unseen"].reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"grade": [1, 2]}, "grade: each answer's grade must lie in [0, 1]"),
        ({"grade": [1, float("nan")]}, "grade: each answer's grade must lie in [0, 1]"),
        ({"decoded_by": ["a"]}, "one entry per answer"),
        ({"log_probs": {"a": [0.0, np.nan], "b": [0.0, 0.0]}}, "log_probs['a']"),
        ({"log_probs": {"a": [0.0, 0.5], "b": [0.0, 0.0]}}, "each <= 0"),
        ({"log_probs": {"a": [0.0, 0.0]}}, "missing ['b']"),
        ({"methods": ["c"]}, "methods: ['c'] have no log-probabilities"),
        ({"reference": "c"}, "reference: 'c' has no log-probabilities"),
        ({"n_boot": 5}, "n_boot must be an integer >= 100"),
        ({"log_probs": {"a": [-np.inf, 0.0], "b": [-np.inf, 0.0]}}, "has probability 0 under every decoding method"),
    ],
)
def test_bad_input_is_one_line_naming_the_argument(kwargs, message):
    args = {
        "problem": [0, 1],
        "decoded_by": ["a", "b"],
        "grade": [1, 0],
        "log_probs": {"a": [-1.0, -2.0], "b": [-1.5, -0.5]},
        "methods": ["b"],
        "reference": "a",
    }
    args.update(kwargs)
    with pytest.raises(ValueError) as info:
        pooled_accuracy(**args)
    assert message in str(info.value) and "\n" not in str(info.value)


ALONE_LABEL = "verifier alone"


def test_on_choice_records_the_pool_agrees_with_the_exact_referee():
    from trace_builders import choice_records

    from cactus_theory._analysis._pooled import pooled_on_choice_records

    records = choice_records(600, 3)
    result = pooled_on_choice_records(
        records, ["sps", "cactus(delta=1)"], ["cactus(delta=4)", "lossy(alpha=0.5)", "tas"], n_boot=500, seed=1
    )
    methods = [r.method for r in result["pooled"]]
    assert methods == [ALONE_LABEL, "sps", "cactus(delta=1)", "cactus(delta=4)", "lossy(alpha=0.5)", "tas"]
    assert all(result["agree"].values()), result["agree"]
    # the exact differences are not all 0 here: the check has something to find
    assert max(abs(result["exact"][m]["difference"]) for m in methods) > 0.01
