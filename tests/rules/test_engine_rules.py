"""The verification methods engines and papers added (issue 33), each against its source's
algorithm written out step by step here and enumerated over every drafted block and coin
pattern on small vocabularies: FLy (vLLM PR 53987's pre-pass on the uniforms, then the native
first-rejection scan)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cactus_theory import analyze_trace, make_rule
from cactus_theory.testing import check_rule
from cactus_theory.traces import trace_from_arrays


def _rows(seed, m, vocab, sharp=1.0):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, sharp), size=m)
    q = rng.dirichlet(np.full(vocab, sharp), size=m + 1)
    if seed % 3 == 0:  # tokens one model excludes
        p[0, rng.integers(vocab)] = 0.0
        q[1, rng.integers(vocab)] = 0.0
        p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    return p, q


def _top3_entropy(row, k=3):
    top = sorted(row, reverse=True)[:k]
    return -sum(x * np.log(x) for x in top if x > 0)


def _fly_kernel(p, q, drafts, native, theta, window, top_k=3):
    """vLLM's apply_fly_random_acceptance_kernel for one request, then the native scan, for one
    pattern of native decisions (True: q/p >= u at that slot): the number of accepted drafts."""
    m = len(drafts)
    forced = list(native)
    for pos in range(m):
        x = drafts[pos]
        can_defer = (
            not native[pos]
            and p[pos, x] > 0
            and q[pos, x] > 0
            and pos + window < m
            and _top3_entropy(q[pos], top_k) >= theta
        )
        for offset in range(1, window + 1):
            can_defer = can_defer and pos + offset < m and native[pos + offset]
        if can_defer:
            forced[pos] = True  # u = 0: the native kernel accepts
    tau = 0
    while tau < m and forced[tau]:
        tau += 1
    return tau


def _native_rate(p, q, x):
    return 1.0 if p[x] <= 0 < q[x] else (min(1.0, q[x] / p[x]) if p[x] > 0 else 0.0)


def _fly_law(p, q, drafts, theta, window, top_k=3):
    """P(tau = i), i = 0..m, by enumerating the 2^m native decisions."""
    m = len(drafts)
    rates = [_native_rate(p[i], q[i], drafts[i]) for i in range(m)]
    law = np.zeros(m + 1)
    for pattern in itertools.product([True, False], repeat=m):
        weight = float(np.prod([r if ok else 1 - r for r, ok in zip(rates, pattern, strict=True)]))
        law[_fly_kernel(p, q, drafts, pattern, theta, window, top_k)] += weight
    return law


def _residual(q, p):
    r = np.maximum(q - p, 0.0)
    return r / r.sum() if r.sum() > 0 else q / q.sum()


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    m=st.integers(1, 5),
    window=st.integers(1, 3),
    theta=st.sampled_from([0.0, 0.2, 0.5, 10.0]),
)
def test_fly_block_law_is_vllms_kernel(seed, m, window, theta):
    vocab = 3
    p, q = _rows(seed, m, vocab)
    rule = make_rule(f"fly(threshold={theta}, window={window})")
    rng = np.random.default_rng(seed)
    drafts = np.array([rng.choice(vocab, p=p[i]) for i in range(m)])
    law = rule.block_law(p, q, drafts)
    np.testing.assert_allclose(law.accepted, _fly_law(p, q, drafts, theta, window), rtol=0, atol=1e-12)
    for i in range(m):
        np.testing.assert_allclose(law.emitted[i], _residual(q[i], p[i]), atol=1e-15)
    np.testing.assert_allclose(law.emitted[m], q[m])


def _fly_over_drafts(p, q, m, theta, window, start=0):
    """E[tau] and, per slot j < m, (P(tau >= j), the law of the token emitted at slot j), by
    enumerating every drafted block and native pattern."""
    vocab = q.shape[-1]
    al, reach, laws = 0.0, np.zeros(m + 1), np.zeros((m, vocab))
    for drafts in itertools.product(range(vocab), repeat=m):
        w = float(np.prod([p[start + i, x] for i, x in enumerate(drafts)]))
        if w == 0:
            continue
        pp, qq = p[start : start + m], q[start : start + m + 1]
        law = _fly_law(pp, qq, list(drafts), theta, window)
        for tau, mass in enumerate(law):
            al += w * mass * tau
            for j in range(tau + 1):
                reach[j] += w * mass
                if j < tau:
                    laws[j, drafts[j]] += w * mass
                elif j < m:
                    laws[j] += w * mass * _residual(qq[j], pp[j])
    return al, reach, laws


@pytest.mark.parametrize("theta, window", [(0.0, 1), (0.3, 1), (0.0, 2), (0.1, 2)])
def test_fly_accepted_length_and_drift_over_the_drafts(theta, window):
    m, vocab = 4, 3
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.full(vocab, 0.8), size=m + 2)
    q = rng.dirichlet(np.full(vocab, 0.8), size=m + 2)
    rule = make_rule(f"fly(threshold={theta}, window={window})")
    ((_, values, errors),) = rule.expected_block_lengths_for(p, q, (m,)).values()
    ((kl, tv),) = rule.block_drift_for(p, q, (m,)).values()
    assert values.shape == (3,) and (errors == 0).all()
    for start in range(3):
        al, reach, laws = _fly_over_drafts(p, q, m, theta, window, start)
        assert values[start] == pytest.approx(al, abs=1e-12)
        want_kl = want_tv = 0.0
        for j in range(m):
            pi, target = laws[j] / reach[j], q[start + j]
            want_kl += reach[j] * float(np.sum(np.where(pi > 0, pi * np.log(pi / target), 0.0)))
            want_tv += reach[j] * 0.5 * float(np.abs(pi - target).sum())
        assert kl[start] == pytest.approx(want_kl, abs=1e-12)
        assert tv[start] == pytest.approx(want_tv, abs=1e-12)
    # the override only adds passes: never below SpS, above it where the gate is open
    sps = make_rule("sps")
    from cactus_theory.laws import block_accepted_length

    assert (values >= block_accepted_length(sps, p, q, m) - 1e-12).all()
    if theta == 0.0:
        assert (values > block_accepted_length(sps, p, q, m) + 1e-6).all() and (kl > 0).all()


def test_fly_without_a_fitting_window_is_sps():
    p, q = _rows(2, 4, 5)
    full = np.concatenate([p, p[:1]])
    for m in (1, 3, 4):  # window 6 never fits a block of m <= 6
        ((_, values, _),) = make_rule("fly").expected_block_lengths_for(full, q, (m,)).values()
        from cactus_theory.laws import block_accepted_length

        np.testing.assert_allclose(values, block_accepted_length("sps", full, q, m), atol=1e-14)
        ((kl, tv),) = make_rule("fly").block_drift_for(full, q, (m,)).values()
        np.testing.assert_allclose(kl, 0.0, atol=1e-14)
        np.testing.assert_allclose(tv, 0.0, atol=1e-14)


def test_fly_top_entropy_is_vllms():
    from cactus_theory._rules.fly import top_entropy

    q = np.array([[0.5, 0.3, 0.1, 0.1], [1.0, 0.0, 0.0, 0.0]])
    want = -(0.5 * np.log(0.5) + 0.3 * np.log(0.3) + 0.1 * np.log(0.1))
    np.testing.assert_allclose(top_entropy(q), [want, 0.0], atol=1e-15)


def test_fly_bad_parameters_say_which():
    for spec, word in (
        ("fly(window=0)", "window"),
        ("fly(threshold=-1)", "threshold"),
        ("fly(entropy_top_k=0)", "entropy_top_k"),
    ):
        with pytest.raises(ValueError, match=word):
            make_rule(spec)


@pytest.mark.parametrize("spec", ["fly", "fly(window=1, threshold=0)"])
def test_fly_passes_check_rule(spec):
    report = check_rule(spec, cases=4)
    assert all(not str(v).startswith("failed") for v in report.values()), report


def test_fly_in_the_analysis_has_its_own_drift(tmp_path):
    rng = np.random.default_rng(5)
    target = rng.normal(size=(60, 16)) * 1.5
    trace = trace_from_arrays(
        tmp_path / "t",
        target + rng.normal(size=target.shape),
        target,
        rng.integers(0, 16, size=60),
        sequence_lengths=[30, 30],
        top_k=16,
        metadata={"sampling": {"temperature": 1.0, "top_k": 16, "top_p": 1.0}},
    )
    result = analyze_trace(trace, ["sps", "fly(window=2, threshold=0)"], ms=(4, 8), n_boot=200)
    rows = {(r["rule"], r["m"]): r for r in result.rows if r["task"] == "all"}
    for m in (4, 8):
        sps, fly = rows["sps", m], rows["fly(threshold=0, window=2)", m]
        assert fly["al"] > sps["al"] and fly["kl_per_token"] > 0 and sps["kl_per_token"] == pytest.approx(0, abs=1e-12)


# --- MagicMTP ----------------------------------------------------------------------------------


def _magic_kernel(px, qx, u):
    """vllm-ascend's rejection_random_sample_block_verify_kernel for one request: the number of
    accepted drafts for one set of uniforms."""
    pi, uniform, last = 1.0, 1.0, -1
    for pos in range(len(px)):
        uniform *= u[pos]
        pi = min(pi * qx[pos] / px[pos], 1.0)
        if px[pos] > 0 and pi >= uniform:
            last = pos
    return last + 1


def test_magic_mtp_two_drafts_closed_form():
    # tau = 2 iff u1 u2 <= w2: P = w2 (1 - log w2); tau = 1 iff u1 <= w1 and u1 u2 > w2
    rng = np.random.default_rng(11)
    rule = make_rule("magic-mtp")
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(3), size=2), rng.dirichlet(np.ones(3), size=3)
        x = rng.integers(0, 3, size=2)
        w1 = min(q[0, x[0]] / p[0, x[0]], 1.0)
        w2 = min(w1 * q[1, x[1]] / p[1, x[1]], 1.0)
        two = w2 * (1 - np.log(w2)) if w2 < 1 else 1.0
        one = max(w1 - w2, 0.0) - (w2 * np.log(w1 / w2) if w1 > w2 else 0.0)
        np.testing.assert_allclose(rule.block_law(p, q, x).accepted, [1 - two - one, one, two], atol=1e-12)


def test_magic_mtp_block_law_is_the_kernel():
    rng = np.random.default_rng(3)
    m, vocab, runs = 4, 3, 200_000
    p, q = rng.dirichlet(np.full(vocab, 0.7), size=m), rng.dirichlet(np.full(vocab, 0.7), size=m + 1)
    x = np.array([rng.choice(vocab, p=p[i]) for i in range(m)])
    law = make_rule("magic-mtp").block_law(p, q, x).accepted
    px, qx = p[np.arange(m), x], q[np.arange(m), x]
    u = rng.random((runs, m))
    tau = np.array([_magic_kernel(px, qx, row) for row in u[:20_000]])
    counts = np.bincount(tau, minlength=m + 1) / tau.size
    # 20,000 runs: each frequency within 5 standard errors of the exact law
    assert np.all(np.abs(counts - law) <= 5 * np.sqrt(law * (1 - law) / tau.size) + 1e-3), (counts, law)


def test_magic_mtp_recovered_token_laws():
    p, q = _rows(4, 3, 4)
    x = np.array([0, 1, 2])
    for recovery in ("block", "residual"):
        law = make_rule(f"magic-mtp(recovery={recovery})").block_law(p, q, x)
        w = 1.0
        for i in range(3):
            want = _residual(w * q[i], p[i]) if recovery == "block" else _residual(q[i], p[i])
            if recovery == "block" and np.maximum(w * q[i] - p[i], 0).sum() == 0:
                want = q[i]
            np.testing.assert_allclose(law.emitted[i], want, atol=1e-14)
            w = min(w * (q[i, x[i]] / p[i, x[i]] if p[i, x[i]] > 0 else 1.0), 1.0)


def test_magic_mtp_is_not_lossless_exactly():
    # the emitted sequence law, enumerated over every draft, tau and recovered token, against the
    # verifier's: Sun et al.'s toy pair (p = (2/3, 1/3), q = (1/3, 2/3) at every position)
    from cactus_theory._laws._sequence import _sequence_law

    small, big = np.array([[1 / 3, 2 / 3]] * 6), np.array([[2 / 3, 1 / 3]] * 6)
    for spec, lossless in (("block", True), ("magic-mtp", False), ("magic-mtp(recovery=residual)", False)):
        law = _sequence_law(make_rule(spec), big, small, 2, 3)
        tv = 0.5 * sum(
            abs(law.get(s, 0.0) - np.prod([small[i, y] for i, y in enumerate(s)]))
            for s in itertools.product(range(2), repeat=3)
        )
        assert (tv < 1e-12) if lossless else (tv > 0.1), (spec, tv)
    # the first two tokens by decoding with the kernel written out: blocks of 2 drafts until 2 tokens
    rng = np.random.default_rng(0)
    runs, hits = 20_000, 0
    for _ in range(runs):
        out = []
        while len(out) < 2:
            x = rng.choice(2, size=2, p=big[0])
            tau = _magic_kernel(big[0, x], small[0, x], rng.random(2))
            w = 1.0
            for i in range(tau):
                w = min(w * small[0, x[i]] / big[0, x[i]], 1.0)
            tail = rng.choice(2, p=small[0]) if tau == 2 else rng.choice(2, p=_residual(w * small[0], big[0]))
            out += [*x[:tau], tail]
        hits += tuple(out[:2]) == (0, 0)
    exact = _sequence_law(make_rule("magic-mtp"), big, small, 2, 2)[(0, 0)]
    assert exact > 0.2 and abs(hits / runs - exact) < 5 * np.sqrt(exact * (1 - exact) / runs)


def test_magic_mtp_lengths_and_drift_on_rows():
    rng = np.random.default_rng(8)
    p, q = rng.dirichlet(np.full(3, 0.6), size=7), rng.dirichlet(np.full(3, 0.6), size=7)
    rule = make_rule("magic-mtp")
    m = 3
    ((method, exact, _),) = rule.expected_block_lengths_for(p, q, (m,), method="exact").values()
    ((method_mc, sampled, errors),) = rule.expected_block_lengths_for(p, q, (m,), n_paths=20_000, seed=2).values()
    assert method == "exact" and method_mc == "monte-carlo"
    assert np.all(np.abs(sampled - exact) <= 5 * errors + 1e-12) and (errors > 0).all()
    # per-slot drift by enumeration of the drafts with the exact law of tau, against the Monte Carlo
    ((kl, tv),) = rule.block_drift_for(p, q, (m,), n_paths=20_000, seed=2).values()
    for start in range(p.shape[0] - m + 1):
        reach, laws = np.zeros(m + 1), np.zeros((m, 3))
        for drafts in itertools.product(range(3), repeat=m):
            wt = float(np.prod([p[start + i, d] for i, d in enumerate(drafts)]))
            block = rule.block_law(
                p[start : start + m], np.concatenate([q[start : start + m], q[:1]]), np.array(drafts)
            )
            for tau, mass in enumerate(block.accepted):
                for j in range(min(tau, m) + 1):
                    reach[j] += wt * mass
                    if j < tau:
                        laws[j, drafts[j]] += wt * mass
                    elif j < m:
                        laws[j] += wt * mass * block.emitted[j]
        want_tv = sum(reach[j] * 0.5 * np.abs(laws[j] / reach[j] - q[start + j]).sum() for j in range(m))
        want_kl = sum(
            reach[j]
            * float(np.sum(np.where(laws[j] > 0, laws[j] / reach[j] * np.log(laws[j] / reach[j] / q[start + j]), 0.0)))
            for j in range(m)
        )
        assert tv[start] == pytest.approx(want_tv, abs=0.02)
        assert kl[start] == pytest.approx(want_kl, abs=0.02)  # plug-in: biased up by ~ 3 / (2 n) per slot


def test_magic_mtp_bad_recovery_says_which():
    with pytest.raises(ValueError, match="recovery"):
        make_rule("magic-mtp(recovery=argmax)")


@pytest.mark.parametrize("spec", ["magic-mtp", "magic-mtp(recovery=residual)"])
def test_magic_mtp_passes_check_rule(spec):
    report = check_rule(spec, cases=4)
    assert all(not str(v).startswith("failed") for v in report.values()), report


# --- Entropy verify ------------------------------------------------------------------------------


def _entropy_verify_reference(p, q, ori, drafted, threshold, alpha, epsilon=1e-10):
    """vllm-ascend's rejection_random_sample_pytorch with ENTROPY_VERIFY for one draft, integrated
    over its uniform: P(p(n) > 0 and q(n) / p(n) >= c u), c = min(exp(-alpha H(ori)), threshold)."""
    entropy = -sum(s * np.log(s + epsilon) for s in ori)
    c = min(np.exp(-entropy * alpha), threshold)
    if p[drafted] <= 0:
        return 0.0 if q[drafted] <= 0 else 1.0  # the package's limit convention for a token p never drafts
    return min(1.0, q[drafted] / p[drafted] / c)


def test_entropy_verify_is_the_kernel():
    from cactus_theory.rules import RuleLogits

    rng = np.random.default_rng(4)
    for _ in range(30):
        vocab = int(rng.integers(2, 7))
        p, q = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab) * 0.5)
        logits = rng.normal(size=vocab) * 2
        ori = np.exp(logits - logits.max())
        ori /= ori.sum()
        threshold, alpha = float(rng.choice([0.5, 0.95, 1.0])), float(rng.choice([0.0, 0.4, 1.0, 3.0]))
        rule = make_rule(f"entropy-verify(threshold={threshold}, alpha={alpha})")
        for n in range(vocab):
            got = float(rule.acceptance(p, q, n, logits=RuleLogits(target=logits)))
            assert got == pytest.approx(_entropy_verify_reference(p, q, ori, n, threshold, alpha), abs=1e-12)
            proc = make_rule(f"entropy-verify(threshold={threshold}, alpha={alpha}, entropy_of=processed)")
            assert float(proc.acceptance(p, q, n)) == pytest.approx(
                _entropy_verify_reference(p, q, q, n, threshold, alpha), abs=1e-12
            )
        # after a rejection, the native residual
        np.testing.assert_allclose(
            rule.correction(p, q, 0, logits=RuleLogits(target=logits)), _residual(q, p), atol=1e-14
        )


def test_entropy_verify_the_kernels_own_test_case():
    # vllm-ascend's test_entropy_verify_standard_high_entropy_accepts_more: ratio 0.4 / 0.5 = 0.8 < u = 0.85
    # natively; ori = (0.4, 0.35, 0.25), alpha = 0.4: c = min(exp(-0.4 H), 0.95) ~ 0.649, 0.8 >= 0.649 * 0.85
    from cactus_theory.rules import RuleLogits

    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.4, 0.4, 0.2])
    ori = np.array([0.4, 0.35, 0.25])
    rule = make_rule("entropy-verify(threshold=0.95, alpha=0.4)")
    a = float(rule.acceptance(p, q, 0, logits=RuleLogits(target=np.log(ori))))
    entropy = -np.sum(ori * np.log(ori))
    assert np.exp(-0.4 * entropy) == pytest.approx(0.649, abs=1e-3)
    assert a > 0.85 and a == pytest.approx(min(1.0, 0.8 / np.exp(-0.4 * entropy)))
    assert float(make_rule("sps").acceptance(p, q, 0)) == pytest.approx(0.8)


def test_entropy_verify_bad_parameters_say_which():
    for spec, word in (
        ("entropy-verify(threshold=0)", "threshold"),
        ("entropy-verify(alpha=-1)", "alpha"),
        ("entropy-verify(entropy_of=raw)", "entropy_of"),
    ):
        with pytest.raises(ValueError, match=word):
            make_rule(spec)


@pytest.mark.parametrize("spec", ["entropy-verify", "entropy-verify(alpha=0.4, entropy_of=processed)"])
def test_entropy_verify_passes_check_rule(spec):
    report = check_rule(spec, cases=4)
    assert all(not str(v).startswith("failed") for v in report.values()), report


# --- vLLM's synthetic acceptance by a target mean acceptance length ------------------------------


@pytest.mark.parametrize(
    "length, n, want",
    [
        (3.5, 5, [1.0, 1.0, 0.5, 0.0, 0.0]),
        (2.0, 4, [1.0, 0.0, 0.0, 0.0]),
        (1.0, 3, [0.0, 0.0, 0.0]),
        (4.25, 3, [1.0, 1.0, 1.0]),
    ],
)
def test_synthetic_acceptance_length_is_vllms_schedule(length, n, want):
    # vLLM's _acceptance_length_to_rates written out: floor(L - 1) ones, the fraction, zeros, cut at n
    drafts = length - 1
    full = int(drafts)
    ref = ([1.0] * full + [drafts - full] + [0.0] * (n - full - 1))[:n]
    assert ref == want
    rule = make_rule(f"synthetic(acceptance_length={length})")
    got = [rule.at_slot(j).conditional_rate for j in range(n)]
    unconditional = np.cumprod(got)
    np.testing.assert_allclose(unconditional, ref, atol=1e-15)
    # the expected accepted length of a block of n drafts is the sum of the rates: L - 1 up to n
    from cactus_theory.laws import block_accepted_length

    p, q = _rows(1, n + 1, 4)
    assert block_accepted_length(rule, p[: n + 1], q[: n + 1], n)[0] == pytest.approx(sum(ref), abs=1e-12)


def test_synthetic_takes_rates_or_a_length_not_both():
    with pytest.raises(ValueError, match="not both"):
        make_rule("synthetic(rates=[0.5], acceptance_length=2)")
    with pytest.raises(ValueError, match="acceptance_length"):
        make_rule("synthetic(acceptance_length=0.5)")
    assert make_rule("synthetic(acceptance_length=2.5)").describe() == "synthetic(acceptance_length=2.5)"
