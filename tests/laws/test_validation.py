"""Every public function that takes distributions refuses bad ones (NaN, negative, unnormalised, infinite,
wrongly shaped) with a ValueError naming the argument, for every rule of the list."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import cactus_theory as ct
from cactus_theory._rules import kind_of

RULES = [
    "sps",
    "cactus(delta=0.5)",
    "cactus-exact(delta=0.5)",
    "mentored(delta=0.3)",
    "tas",
    "lossy(alpha=0.3)",
    "topk(k=2)",
    "block",
    "rrs(k=2)",
    "eagle-tree(k=2)",
    "spectr(k=2)",
    "sglang-tree(k=2)",
]


POLICY = ct.laws.make_draft_policy("p-min(0.4)")


def _calls():
    """(name, which arguments are probabilities, call(p, q)) for every public function taking them:
    p and q are (T, V) rows (T = 3), every function gets what it needs from them."""
    out = []
    for spec in RULES:
        rule = ct.make_rule(spec)
        one = rule.single() if kind_of(rule) == "multi-draft" else rule
        out += [
            (
                f"emitted_distribution[{spec}]",
                ("draft_probs", "target_probs"),
                lambda p, q, r=rule: ct.emitted_distribution(r, p, q),
            ),
            (f"step_metrics[{spec}]", ("draft_probs", "target_probs"), lambda p, q, r=rule: ct.step_metrics(r, p, q)),
            (
                f"{spec}.acceptance",
                ("draft_probs", "target_probs"),
                lambda p, q, r=one: r.acceptance(p, q, np.zeros(len(q), int)),
            ),
            (
                f"{spec}.correction",
                ("draft_probs", "target_probs"),
                lambda p, q, r=one: r.correction(p, q, np.zeros(len(q), int)),
            ),
            (
                f"{spec}.acceptance_and_correction",
                ("draft_probs", "target_probs"),
                lambda p, q, r=one: r.acceptance_and_correction(p, q, np.zeros(len(q), int)),
            ),
            (
                f"{spec}.bonus_distribution",
                ("draft_probs", "target_probs"),
                lambda p, q, r=rule: r.bonus_distribution(p, q, policy="relaxed"),
            ),
            (
                f"{spec}.bonus_distribution(verifier)",
                ("draft_probs", "target_probs"),
                lambda p, q, r=rule: r.bonus_distribution(p, q),
            ),
            (f"{spec}.emitted", ("draft_probs", "target_probs"), lambda p, q, r=rule: r.emitted(p, q)),
            (f"{spec}.acceptance_all", ("draft_probs", "target_probs"), lambda p, q, r=one: r.acceptance_all(p, q)),
            (f"{spec}.logits_exact", ("draft_probs", "target_probs"), lambda p, q, r=one: r.logits_exact(p, q)),
            (
                f"block_accepted_length[{spec}]",
                ("draft_probs", "target_probs"),
                lambda p, q, r=one: ct.laws.block_accepted_length(r, p, q, 2),
            ),
            (
                f"{spec}.block_law",
                ("draft_probs", "target_probs"),
                lambda p, q, r=one: r.block_law(p[:2], q, np.zeros(2, int)),
            ),
            (
                f"simulate[{spec}]",
                ("draft_probs", "target_probs"),
                lambda p, q, r=rule: ct.simulate(r, p, q, m=2, n_runs=4),
            ),
        ]
        if isinstance(rule, ct.rules.GeneralizedRule):
            out.append(
                (
                    f"{spec}.surrogate",
                    ("draft_probs", "target_probs"),
                    lambda p, q, r=rule: r.surrogate(p, q, np.zeros(len(q), int)),
                )
            )
        if kind_of(rule) == "multi-draft":
            out += [
                (
                    f"{spec}.multi_acceptance",
                    ("draft_probs", "target_probs"),
                    lambda p, q, r=rule: r.multi_acceptance(p, q),
                ),
                (
                    f"{spec}.multi_outside_support",
                    ("draft_probs", "target_probs"),
                    lambda p, q, r=rule: r.multi_outside_support(p, q),
                ),
                (
                    f"{spec}.verify",
                    ("draft_probs", "target_probs"),
                    lambda p, q, r=rule: r.verify(p[0], q[0], np.zeros(r.k, int)),
                ),
                (f"{spec}.draft_tuples", ("draft_probs",), lambda p, q, r=rule: r.draft_tuples(p[0])),
                (
                    f"{spec}.sample_drafts",
                    ("draft_probs",),
                    lambda p, q, r=rule: r.sample_drafts(np.random.default_rng(0), p),
                ),
            ]
    out += [
        (
            "optimal_multi_draft_acceptance",
            ("draft_probs", "target_probs"),
            lambda p, q: ct.rules.optimal_multi_draft_acceptance(p, q, 2),
        ),
        ("greedy_draft", ("draft_probs",), lambda p, q: ct.laws.greedy_draft(p)),
        ("top_drafts", ("draft_probs",), lambda p, q: ct.rules.top_drafts(p, 2)),
        ("mentored_surrogate", ("draft_probs", "target_probs"), lambda p, q: ct.rules.mentored_surrogate(p, q, 0.5)),
        ("cactus_surrogate", ("target_probs",), lambda p, q: ct.cactus_surrogate(q, np.zeros(len(q), int), 0.5)),
        ("divergence", ("dist", "target_probs"), lambda p, q: ct.divergence(p, q)),
        ("policy_blocks", ("draft_probs",), lambda p, q: ct.laws.policy_blocks(POLICY, p, np.full(len(p), 0.5), 2)),
        (
            "emitted_distribution[eagle-tree]",
            ("draft_probs", "target_probs"),
            lambda p, q: ct.emitted_distribution("eagle-tree(k=3)", p, q),
        ),
    ]
    return out


CALLS = _calls()


CORRUPTIONS = ("nan", "negative", "unnormalised", "inf", "wrong_shape")


def _corrupt(x, how, where):
    """``x`` with one entry of every row made bad (so any rows a function reads are bad)."""
    x = x.copy()
    _, col = where
    if how == "nan":
        x[:, col] = np.nan
    elif how == "inf":
        x[:, col] = np.inf
    elif how == "negative":
        x[:, col] = -0.2
        x /= x.sum(-1, keepdims=True)  # still sums to 1: only the sign is wrong
    elif how == "unnormalised":
        x *= 1.5
    else:
        x = np.concatenate([x, np.full((len(x), 1), 0.0)], axis=-1)  # one more token than the other
    return x


@pytest.mark.parametrize(("name", "arguments", "call"), CALLS, ids=[c[0] for c in CALLS])
@given(
    seed=st.integers(0, 10_000),
    how=st.sampled_from(CORRUPTIONS),
    which=st.integers(0, 1),
    where=st.tuples(st.integers(0, 2), st.integers(0, 4)),
)
def test_bad_probabilities_are_refused_naming_the_argument(name, arguments, call, seed, how, which, where):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(5), size=3), rng.dirichlet(np.ones(5), size=3)
    call(p, q)  # the good inputs work
    argument = arguments[min(which, len(arguments) - 1)]
    bad_first = argument in ("draft_probs", "dist")
    # one probability argument: its own shape has no other to disagree with
    assume(not (how == "wrong_shape" and len(arguments) == 1))
    bp, bq = (_corrupt(p, how, where), q) if bad_first else (p, _corrupt(q, how, where))
    with pytest.raises(ValueError) as info:
        call(bp, bq)
    message = str(info.value)
    if how == "wrong_shape":
        assert "shape" in message or "vocabulary" in message or "must be" in message, message
    else:
        assert argument in message, (name, how, argument, message)
    assert len(message) < 800


def test_every_public_function_of_the_list_exists_and_the_list_covers_the_protocol():
    names = {c[0].split("[")[0].split(".")[-1] for c in CALLS}
    protocol = {
        "acceptance",
        "correction",
        "acceptance_and_correction",
        "bonus_distribution",
        "emitted",
        "acceptance_all",
        "logits_exact",
        "block_law",
        "surrogate",
        "multi_acceptance",
        "verify",
    }
    assert protocol <= names


@pytest.mark.parametrize("value", [0, 1, 7, np.int64(3), np.uint8(2)])
def test_check_int_takes_integers_in_range(value):
    from cactus_theory._math._validation import check_int

    assert check_int(value, "n", 0, high=7) == int(value) and type(check_int(value, "n", 0)) is int


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (True, {"low": 0}, "n must be an integer >= 0; got True"),
        (np.bool_(True), {"low": 0}, "n must be an integer >= 0; got"),
        (1.0, {"low": 0}, "n must be an integer >= 0; got 1.0"),
        ("3", {}, "n must be an integer; got '3'"),
        (0, {"low": 1, "what": "drafted tokens"}, "n must be an integer >= 1 (drafted tokens); got 0"),
        (9, {"low": 1, "high": 8}, "n must be an integer between 1 and 8; got 9"),
        (9, {"high": 8}, "n must be an integer <= 8; got 9"),
        (None, {"low": 0}, "n must be an integer >= 0; got None"),
    ],
)
def test_check_int_names_the_argument_and_the_bound(value, kwargs, message):
    from cactus_theory._math._validation import check_int

    low = kwargs.pop("low", None)
    with pytest.raises(ValueError) as err:
        check_int(value, "n", low, **kwargs)
    assert str(err.value).startswith(message)


def test_check_int_raises_the_callers_error():
    from cactus_theory._math._validation import check_int

    class Refused(Exception):
        pass

    with pytest.raises(Refused, match="retries must be an integer >= 0"):
        check_int(-1, "retries", 0, error=Refused)
