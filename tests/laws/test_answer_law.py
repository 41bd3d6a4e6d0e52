"""answer_log_prob: the exact probability that speculative decoding emits an answer, against the enumeration of
every drafted block, accepted length and emitted token (the algorithm step by step, through the rules' per-token
acceptance and correction), and against ``sequence_law``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cactus_theory._laws._answer_law import answer_log_prob, answer_step_factors
from cactus_theory._laws._sequence import _sequence_law
from cactus_theory._math._logits import RuleLogits
from cactus_theory._rules._protocol import judgement_of
from cactus_theory._rules._registry import available_rules, make_rule

TEMPERATURE = 0.7


def _world(seed, positions, vocab=3):
    """Context-free rows at each position: raw logits of both models, and the laws they give at TEMPERATURE."""
    rng = np.random.default_rng(seed)
    raw_p, raw_q = rng.normal(0, 1.5, (positions, vocab)), rng.normal(0, 1.5, (positions, vocab))

    def law(raw):
        z = np.exp((raw - raw.max(-1, keepdims=True)) / TEMPERATURE)
        return z / z.sum(-1, keepdims=True)

    return law(raw_p), law(raw_q), raw_p, raw_q


def _enumerated_law(rule, p, q, raw_p, raw_q, m, length, bonus_policy):
    """{tokens: probability} of the first ``length`` tokens, every draft, accepted length and emitted token
    enumerated, each draft judged by ``rule.at_slot(j).acceptance_and_correction`` (the relaxed bonus: one more
    draft at the bonus position, judged the same way), the rows of the position each token lands on."""
    vocab = q.shape[1]

    def judge(j, t, x):
        lg = RuleLogits(target=raw_q[t], draft=raw_p[t], temperature=TEMPERATURE) if rule.needs_logits else None
        a, r = rule.at_slot(j).acceptance_and_correction(p[t], q[t], x, logits=lg)
        return float(a), np.asarray(r, dtype=np.float64)

    memo = {}

    def law_from(s):
        if s >= length:
            return {(): 1.0}
        if s in memo:
            return memo[s]
        out = {}

        def add(head, weight):
            if weight == 0.0:
                return
            for tail, w in law_from(s + len(head)).items():
                key = (head + tail)[: length - s]
                out[key] = out.get(key, 0.0) + weight * w

        for drafts in itertools.product(range(vocab), repeat=m):
            weight = float(np.prod([p[s + j, x] for j, x in enumerate(drafts)]))
            if weight == 0.0:
                continue
            alive = weight
            for j, x in enumerate(drafts):
                a, r = judge(j, s + j, x)
                for y in range(vocab):
                    add((*drafts[:j], y), alive * (1 - a) * r[y])
                alive *= a
            t = s + m
            if bonus_policy == "verifier":
                for y in range(vocab):
                    add((*drafts, y), alive * q[t, y])
            else:
                for x in range(vocab):
                    a, r = judge(m, t, x)
                    add((*drafts, x), alive * p[t, x] * a)
                    for y in range(vocab):
                        add((*drafts, y), alive * p[t, x] * (1 - a) * r[y])
        memo[s] = out
        return out

    return law_from(0)


def _token_rules():
    rules = []
    for name in available_rules():
        rule = make_rule(name)
        if judgement_of(rule).per_token:
            rules.append(rule)
            rules.extend(type(rule)(**example) for example in type(rule).examples[:1])
    return rules


TOKEN_RULES = _token_rules()


@pytest.mark.parametrize("rule", TOKEN_RULES, ids=lambda r: r.describe())
def test_every_token_rule_equals_the_enumerated_law(rule):
    length = 4
    for seed, m in ((1, 1), (2, 2), (3, 3)):
        p, q, raw_p, raw_q = _world(seed, length + m + 2)
        lg = RuleLogits(target=raw_q[:length], draft=raw_p[:length], temperature=TEMPERATURE)
        for policy in ("verifier", "relaxed"):
            law = _enumerated_law(rule, p, q, raw_p, raw_q, m, length, policy)
            assert abs(sum(law.values()) - 1.0) < 1e-12
            for tokens, want in law.items():
                got = answer_log_prob(
                    rule,
                    p[:length],
                    q[:length],
                    np.array(tokens),
                    m,
                    bonus_policy=policy,
                    logits=lg if rule.needs_logits else None,
                )
                assert abs(np.exp(got) - want) <= 1e-12, (rule.describe(), m, policy, tokens, np.exp(got), want)


@pytest.mark.parametrize("spec", ["sps", "cactus(delta=1)", "lossy(alpha=0.5)", "tas", "topk(k=2)", "always-accept"])
def test_equals_sequence_law_up_to_m_4_and_length_6(spec):
    rule = make_rule(spec)
    for m, length in ((1, 6), (2, 6), (3, 5), (4, 4)):
        p, q, _, _ = _world(10 + m, length + m + 1)
        law = _sequence_law(rule, p, q, m, length)
        for tokens, want in law.items():
            got = answer_log_prob(spec, p[:length], q[:length], np.array(tokens), m)
            assert abs(np.exp(got) - want) <= 1e-12, (spec, m, tokens)


def test_draft_lengths_at_once_equal_one_at_a_time():
    p, q, _, _ = _world(4, 12, vocab=5)
    tokens = np.random.default_rng(0).integers(0, 5, 12)
    many = answer_log_prob("cactus(delta=1)", p, q, tokens, [1, 3, 8])
    assert many.shape == (3,)
    for value, m in zip(many, (1, 3, 8), strict=True):
        assert value == answer_log_prob("cactus(delta=1)", p, q, tokens, m)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), m=st.integers(1, 6), spec=st.sampled_from(["sps", "strict", "sglang-chain", "tli"]))
def test_a_lossless_rule_gives_the_verifiers_probability(seed, m, spec):
    rng = np.random.default_rng(seed)
    length, vocab = int(rng.integers(1, 40)), int(rng.integers(2, 30))
    p, q = rng.dirichlet(np.full(vocab, 0.3), length), rng.dirichlet(np.full(vocab, 0.3), length)
    tokens = np.array([rng.choice(vocab, p=row) for row in q])
    want = float(np.sum(np.log(q[np.arange(length), tokens])))
    assert abs(answer_log_prob(spec, p, q, tokens, m) - want) <= 1e-11 * max(1.0, abs(want))
    assert answer_log_prob(None, p, q, tokens, m) == pytest.approx(want, abs=1e-12)


def test_long_answers_in_log_space_and_impossible_ones():
    # 5,000 tokens: a probability of e^-10000 or so, far below float64's least number, kept in log space
    rng = np.random.default_rng(5)
    length, vocab = 5000, 50
    p, q = rng.dirichlet(np.ones(vocab), length), rng.dirichlet(np.ones(vocab), length)
    tokens = np.array([rng.choice(vocab, p=row) for row in q])
    value = answer_log_prob("sps", p, q, tokens, 4)
    want = float(np.sum(np.log(q[np.arange(length), tokens])))
    assert want < -5000 and abs(value - want) <= 1e-9 * abs(want)
    # a token neither model can emit: probability 0
    q0, p0 = q[:3].copy(), p[:3].copy()
    q0[1] = p0[1] = np.eye(vocab)[0]
    assert answer_log_prob("cactus(delta=1)", p0, q0, np.array([tokens[0], 7, tokens[2]]), 2) == -np.inf
    # always-accept emits the drafted token: a token the drafter never proposes is impossible within a block
    p1 = np.tile(np.eye(2)[0], (3, 1))
    q1 = np.full((3, 2), 0.5)
    assert answer_log_prob("always-accept", p1, q1, np.array([1, 0, 0]), 2) == -np.inf
    assert answer_log_prob("always-accept", p1, q1, np.array([0, 0, 1]), 2) == pytest.approx(np.log(0.5))


def test_a_compact_support_gives_the_full_vocabularys_answer():
    # rows confined to a few tokens of a large vocabulary: the same probability on the compact support
    rng = np.random.default_rng(6)
    length, vocab, kept = 30, 2000, 12
    p, q = np.zeros((length, vocab)), np.zeros((length, vocab))
    support = np.stack([rng.choice(vocab, kept, replace=False) for _ in range(length)])
    for t in range(length):
        p[t, support[t]] = rng.dirichlet(np.ones(kept))
        q[t, support[t]] = rng.dirichlet(np.ones(kept))
    tokens = np.array([rng.choice(vocab, p=row) for row in q])
    full = answer_log_prob("cactus(delta=2)", p, q, tokens, [2, 5])
    union = sorted(set(support.ravel().tolist()))
    where = {t: i for i, t in enumerate(union)}
    compact = answer_log_prob("cactus(delta=2)", p[:, union], q[:, union], np.array([where[t] for t in tokens]), [2, 5])
    np.testing.assert_allclose(compact, full, rtol=1e-12)


def test_the_factors_add_to_the_emitted_law():
    p, q, _, _ = _world(7, 6, vocab=4)
    tokens = np.array([0, 1, 2, 3, 0, 1])
    f = answer_step_factors("cactus(delta=1)", p, q, tokens, 3)
    from cactus_theory._laws._emitted import emitted_distribution

    pi = emitted_distribution(make_rule("cactus(delta=1)"), p, q)
    np.testing.assert_allclose(f["accept"][0] + f["reject"][0], pi[np.arange(6), tokens], atol=1e-15)
    np.testing.assert_array_equal(f["bonus"][3], q[np.arange(6), tokens])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p, q, y: answer_log_prob("block", p, q, y, 2), "'block' judges whole blocks"),
        (lambda p, q, y: answer_log_prob("eagle-tree(k=3)", p, q, y, 2), "judges whole blocks or several drafts"),
        (lambda p, q, y: answer_log_prob("sps", p, q, y, 0), "m must be an integer >= 1"),
        (lambda p, q, y: answer_log_prob("sps", p, q, y[:-1], 2), "tokens must be one id per row"),
        (lambda p, q, y: answer_log_prob("sps", p, q, y + 9, 2), "tokens must be integer ids in [0, 3)"),
        (lambda p, q, y: answer_log_prob("sps", p[:, :2], q, y, 2), "draft_probs must have target_probs' shape"),
        (lambda p, q, y: answer_log_prob("sps", p, q * 2, y, 2), "target_probs"),
        (lambda p, q, y: answer_log_prob("sps", p, q, y, 2, bonus_policy="exact"), "bonus_policy must be one of"),
        (lambda p, q, y: answer_log_prob("mars", p, q, y, 2), "reads raw logits"),
        (lambda p, q, y: answer_log_prob("sps", None, q, y, 2), "draft_probs: give the drafter's rows"),
    ],
)
def test_bad_input_is_one_line_naming_the_argument(call, message):
    p, q, _, _ = _world(8, 4)
    with pytest.raises(ValueError) as info:
        call(p, q, np.array([0, 1, 2, 0]))
    assert message in str(info.value) and "\n" not in str(info.value)


def _answer_entries(seed, length, vocab=400, kept=64):
    """An answer of ``length`` tokens with both models' whole raw logit rows at each position and the kept
    entries a record holds (``answer_rows``: the top ``kept`` logits and the log-sum-exp), each token one that
    both models keep under the paper's chain (so every rule here can emit the answer at every m)."""
    from cactus_theory._analysis._answer_rows import sequence_rows
    from cactus_theory._math._sampling import SamplingSettings, processed_probs

    rng = np.random.default_rng(seed)
    raw_q = rng.normal(0, 3.0, (length, vocab)).astype(np.float32).astype(np.float64)  # engines' rows are float32
    raw_p = (raw_q + rng.normal(0, 0.3, (length, vocab))).astype(np.float32).astype(np.float64)
    both = processed_probs(raw_q, SamplingSettings()) * processed_probs(raw_p, SamplingSettings())
    tokens = np.array([rng.choice(vocab, p=row / row.sum()) for row in both])  # a token both models keep
    return raw_p, raw_q, tokens, sequence_rows(raw_q, raw_p, tokens, kept)


@pytest.mark.parametrize(
    "spec", ["sps", "cactus(delta=1)", "tas", "lossy(alpha=0.5)", "mars", "relaxed-topk(top_n=10, delta=0.3)"]
)
def test_kept_rows_give_the_whole_rows_probability(spec):
    # the records' top-64 logits a position give every rule's answer probability, at every m, as the models'
    # whole rows do (the chain keeps at most 20 tokens), to 1e-12
    from cactus_theory._analysis._answer_rows import sequence_log_probs
    from cactus_theory._math._sampling import SamplingSettings, processed_probs

    settings = SamplingSettings()
    raw_p, raw_q, tokens, entries = _answer_entries(3, 40)
    p, q = processed_probs(raw_p, settings), processed_probs(raw_q, settings)
    lg = RuleLogits(target=raw_q, draft=raw_p, temperature=settings.temperature)
    rule = make_rule(spec)
    want = answer_log_prob(rule, p, q, tokens, [1, 4, 8], logits=lg if rule.needs_logits else None)
    got = sequence_log_probs(entries, tokens, [spec], [1, 4, 8], settings)
    assert np.all(np.isfinite(want))
    np.testing.assert_allclose(got[rule.describe()], want, rtol=1e-12)
    alone = float(np.sum(np.log(q[np.arange(40), tokens])))
    np.testing.assert_allclose(got["verifier alone"], alone, rtol=1e-12)


def test_kept_rows_refuse_a_chain_that_reaches_past_them():
    from cactus_theory._analysis._answer_rows import sequence_log_probs
    from cactus_theory._math._sampling import SamplingSettings

    _, _, tokens, entries = _answer_entries(4, 5, kept=16)
    for chain in (SamplingSettings(top_k=20), SamplingSettings(top_k=0)):
        with pytest.raises(ValueError, match="may keep tokens beyond the 16 logits"):
            sequence_log_probs(entries, tokens, ["sps"], [2], chain)
    with pytest.raises(ValueError, match="for each of its 4 tokens"):
        sequence_log_probs(entries, tokens[:-1], ["sps"], [2], SamplingSettings(top_k=10))
    with pytest.raises(ValueError, match="an answer of no tokens"):
        sequence_log_probs(entries, [], ["sps"], [2], SamplingSettings(top_k=10))
    broken = {**entries, "draft": {**entries["draft"], "lse": [float("nan")] * 5}}
    with pytest.raises(ValueError, match="answer position 0: the draft's row holds a logit or log-sum-exp"):
        sequence_log_probs(broken, tokens, ["sps"], [2], SamplingSettings(top_k=10))


def test_several_answers_at_once_equal_one_at_a_time():
    rng = np.random.default_rng(9)
    answers, length, vocab = 5, 7, 6
    p, q = rng.dirichlet(np.full(vocab, 0.5), (answers, length)), rng.dirichlet(np.full(vocab, 0.5), (answers, length))
    tokens = rng.integers(0, vocab, (answers, length))
    raw = rng.normal(size=(2, answers, length, vocab))
    lg = RuleLogits(target=raw[0], draft=raw[1], temperature=1.0)
    for spec, logits in (("cactus(delta=1)", None), ("synthetic(rates=[0.9;0.6;0.3])", None), ("mars", lg)):
        together = answer_log_prob(spec, p, q, tokens, [1, 3], bonus_policy="relaxed", logits=logits)
        assert together.shape == (answers, 2)
        for i in range(answers):
            alone = answer_log_prob(
                spec,
                p[i],
                q[i],
                tokens[i],
                [1, 3],
                bonus_policy="relaxed",
                logits=logits and RuleLogits(target=raw[0, i], draft=raw[1, i], temperature=1.0),
            )
            np.testing.assert_allclose(together[i], alone, rtol=1e-13)
    assert answer_log_prob(None, p, q, tokens, 2).shape == (answers,)
