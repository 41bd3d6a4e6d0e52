"""The sequence-level and engine-named methods of issue 33, each against its source's algorithm
written out step by step here: HSD (the authors' ``_speculative_sampling(backward=True,
clever=True)`` with one draft), Traversal Verification (the paper's leaf-to-root loop with
deletions, on chains and on trees drafted without replacement, enumerated over every tree),
SGLang's chain rejection kernel, vLLM's no-draft-probabilities kernel (strict), TLI's vocabulary map and
the adaptive verify length."""

import itertools

import numpy as np
import pytest

from cactus_theory import make_rule
from cactus_theory._rules.traversal import full_tree, sample_tree, traverse
from cactus_theory.laws import make_draft_policy, policy_blocks
from cactus_theory.rules import VocabularyMap
from cactus_theory.testing import check_rule, sequence_tv


def _rows(seed, positions, vocab, sharp=1.0):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, sharp), size=positions)
    q = rng.dirichlet(np.full(vocab, sharp), size=positions)
    return p, q


# --- HSD ------------------------------------------------------------------------------------------


def _hsd_loop(rng, draft_rows, target_rows, drafts):
    """The authors' clever backward step for one drafted chain, as their code does it (their p is
    the verifier, q the drafter): joint prefix probabilities, the ratio capped by its running
    maximum, p_primes = (p_next - q_next)+ / max(sum (p_next - q_next)+, sum (q_next - p_next)+),
    step-back coins, the last index not stepping back, the whole block on the uncapped joint
    ratio. Returns the emitted tokens (accepted drafts, then the resampled or bonus token)."""
    m = len(drafts)
    d = np.array([draft_rows[k, drafts[k]] for k in range(m)])
    t = np.array([target_rows[k, drafts[k]] for k in range(m)])
    joint_d = np.concatenate([[1.0], np.cumprod(d)[:-1]])
    joint_t = np.concatenate([[1.0], np.cumprod(t)[:-1]])
    ratio = np.maximum(joint_t / joint_d, 1.0)
    capped = joint_t / np.maximum.accumulate(ratio)
    diffs = capped[:, None] * target_rows[:m] - joint_d[:, None] * draft_rows[:m]
    plus, minus = np.clip(diffs, 0, None), np.clip(-diffs, 0, None)
    denominator = np.maximum(plus.sum(-1), minus.sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        primes = plus / denominator[:, None]
    step_back = rng.random(m) < 1.0 - primes.sum(-1)  # NaN (no mass either side) never steps back
    stop = 0 if step_back.all() else m - 1 - int(np.argmax(~step_back[::-1]))
    if rng.random() <= np.prod(t / d):
        return (*drafts, int(rng.choice(target_rows.shape[-1], p=target_rows[m])))
    row = primes[stop] if primes[stop].sum() > 0 else target_rows[stop]
    return (*drafts[:stop], int(rng.choice(target_rows.shape[-1], p=row / row.sum())))


def test_hsd_block_law_is_the_authors_loop():
    rule = make_rule("hsd")
    rng = np.random.default_rng(3)
    for seed in range(3):
        p, q = _rows(seed, 4, 3, sharp=0.7)
        m = 3
        drafts = tuple(int(rng.choice(3, p=p[k])) for k in range(m))
        law = rule.block_law(p[:m], q, np.array(drafts))
        n = 40_000
        counts = {}
        for _ in range(n):
            out = _hsd_loop(rng, p[:m], q, drafts)
            counts[out] = counts.get(out, 0) + 1
        for tau in range(m + 1):
            for y in range(3):
                want = law.accepted[tau] * law.emitted[tau, y]
                got = counts.get((*drafts[:tau], y), 0) / n
                assert abs(got - want) <= 4.5 * np.sqrt(want * (1 - want) / n) + 1e-3, (seed, tau, y, got, want)


def test_hsd_is_block_verification_under_greedy_drafts_and_accepts_at_least_as_much():
    hsd, block = make_rule("hsd"), make_rule("block")
    rng = np.random.default_rng(0)
    for seed in range(6):
        p, q = _rows(seed, 5, 4)
        drafts = rng.integers(0, 4, size=(7, 4))
        one_hot = np.zeros((7, 4, 4))
        np.put_along_axis(one_hot, drafts[..., None], 1.0, -1)
        a = hsd.block_law(one_hot, np.broadcast_to(q, (7, 5, 4)), drafts)
        b = block.block_law(one_hot, np.broadcast_to(q, (7, 5, 4)), drafts)
        np.testing.assert_allclose(a.accepted, b.accepted, atol=1e-15)
        np.testing.assert_allclose(a.emitted, b.emitted, atol=1e-15)
        for m in (1, 2, 3):  # exact over the drafts: never below block verification, equal at m = 1
            ours = hsd.expected_block_lengths_for(p, q, (m,), method="exact")[m][1]
            theirs = block.expected_block_lengths_for(p, q, (m,), method="exact")[m][1]
            assert np.all(ours >= theirs - 1e-12)
            if m == 1:
                np.testing.assert_allclose(ours, theirs, rtol=1e-12)


def test_hsd_as_written_is_not_lossless():
    # three tokens, position-dependent rows: the law of the first two tokens leaves the verifier's
    rng = np.random.default_rng(12)
    p = rng.dirichlet(np.ones(3) * 0.5, size=6)
    q = rng.dirichlet(np.ones(3) * 0.5, size=6)
    assert sequence_tv("hsd", p, q, 2, 2) > 0.1
    assert sequence_tv("block", p, q, 2, 2) < 1e-12
    assert make_rule("hsd").lossless is False


def test_hsd_monte_carlo_lengths_and_drift_against_enumeration():
    rule = make_rule("hsd")
    p, q = _rows(5, 7, 3, sharp=0.6)
    m = 3
    exact = rule.expected_block_lengths_for(p, q, (m,), method="exact")[m][1]
    _, mc, error = rule.expected_block_lengths_for(p, q, (m,), n_paths=20_000, seed=2)[m]
    assert np.all(np.abs(mc - exact) <= 4.5 * error + 1e-9)
    kl, tv = rule.block_drift_for(p, q, (m,), n_paths=40_000, seed=1)[m]
    for t in range(p.shape[0] - m):  # the exact per-slot law of the emitted token, by enumeration
        laws, reach = np.zeros((m, 3)), np.zeros(m)
        for drafts in itertools.product(range(3), repeat=m):
            weight = np.prod([p[t + j, x] for j, x in enumerate(drafts)])
            law = rule.block_law(p[t : t + m], q[t : t + m + 1], np.array(drafts))
            for j in range(m):
                reach[j] += weight * law.accepted[j:].sum()
                laws[j, drafts[j]] += weight * law.accepted[j + 1 :].sum()
                laws[j] += weight * law.accepted[j] * law.emitted[j]
        want_kl = want_tv = 0.0
        for j in range(m):
            pi, target = laws[j] / reach[j], q[t + j]
            want_kl += reach[j] * np.sum(np.where(pi > 0, pi * np.log(np.where(pi > 0, pi, 1) / target), 0))
            want_tv += reach[j] * 0.5 * np.abs(pi - target).sum()
        assert abs(kl[t] - want_kl) < 0.01 + 0.2 * want_kl
        assert abs(tv[t] - want_tv) < 0.015 + 0.2 * want_tv


# --- Traversal Verification -----------------------------------------------------------------------


def _traversal_loop(rng, parent, depth, children, tokens, draft_rows, target_rows):
    """The paper's loop on one drafted tree, with its deletions: p_alpha per node from the root
    down; repeatedly take the first leaf in post-order, accept it with p_alpha, else delete it,
    turn its parent's M_b into norm((p_alpha M_b - M_s)+), drop the token from M_s, set the
    parent's p_alpha to S / (S + 1 - p_alpha) and recompute the descendants of its other children.
    Returns (node accepted, token emitted)."""
    n = len(parent)
    alive = [tokens[i] >= 0 or i == 0 for i in range(n)]
    mb = {i: target_rows[depth[i]].copy() for i in range(n)}
    ms = {i: draft_rows[depth[i]].copy() if depth[i] < len(draft_rows) else None for i in range(n)}
    alpha = np.zeros(n)

    def down(i):
        for c in children[i]:
            if alive[c]:
                x = tokens[c]
                ratio = mb[i][x] / ms[i][x] if ms[i][x] > 0 else float(mb[i][x] > 0)
                alpha[c] = min(alpha[i] * ratio, 1.0)
                down(c)

    alpha[0] = 1.0
    down(0)

    def first_leaf(i):
        for c in children[i]:
            if alive[c]:
                return first_leaf(c)
        return i

    while True:
        leaf = first_leaf(0)
        if leaf == 0 or rng.random() < alpha[leaf]:
            row = mb[leaf]
            return leaf, int(rng.choice(len(row), p=row / row.sum()))
        alive[leaf] = False
        u = parent[leaf]
        excess = np.maximum(alpha[u] * mb[u] - ms[u], 0.0)
        s = excess.sum()
        if s > 0:
            mb[u] = excess / s
        ms[u][tokens[leaf]] = 0.0
        if ms[u].sum() > 0:
            ms[u] = ms[u] / ms[u].sum()
        alpha[u] = 1.0 if u == 0 else (s / (s + 1.0 - alpha[u]) if s + 1.0 - alpha[u] > 0 else 1.0)
        down(u)


@pytest.mark.parametrize("k, m", [(1, 3), (2, 2), (3, 1)])
def test_traverse_is_the_papers_loop(k, m):
    parent, depth, children = tree = full_tree(k, m)
    rng = np.random.default_rng(k * 10 + m)
    for seed in range(2):
        p, q = _rows(seed + 7, m + 1, 4, sharp=0.8)
        tokens = sample_tree(rng, tree, p[None, :m])[0]
        stop, law = traverse(tree, tokens[None], p[None, :m], q[None, : m + 1], emitted=True)
        np.testing.assert_allclose(stop.sum(), 1.0, rtol=1e-12)
        n = 30_000
        counts = np.zeros((len(parent), 4))
        for _ in range(n):
            node, y = _traversal_loop(rng, parent, depth, children, tokens, p[:m], q[: m + 1])
            counts[node, y] += 1
        want = stop[0][:, None] * law[0]
        assert np.all(np.abs(counts / n - want) <= 4.5 * np.sqrt(want * (1 - want) / n) + 2e-3)


def test_traversal_on_a_chain_is_block_verification():
    trav, block = make_rule("traversal"), make_rule("block")
    rng = np.random.default_rng(1)
    for seed in range(5):
        p, q = _rows(seed, 6, 5, sharp=0.5)
        for m in (1, 2, 4):
            drafts = rng.integers(0, 5, size=(9, m))
            args = (np.broadcast_to(p[:m], (9, m, 5)), np.broadcast_to(q[: m + 1], (9, m + 1, 5)), drafts)
            a, b = trav.block_law(*args), block.block_law(*args)
            np.testing.assert_allclose(a.accepted, b.accepted, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(a.emitted, b.emitted, rtol=1e-12, atol=1e-15)


def _child_tuples(row, k):
    """Every ordered draw of k children without replacement from ``row`` (fewer when it runs out)."""
    support = [int(x) for x in np.flatnonzero(row > 0)]
    out = []
    for t in itertools.permutations(support, min(k, len(support))):
        prob, left = 1.0, 1.0
        for x in t:
            prob *= row[x] / left
            left -= row[x]
        out.append(((*t, *([-1] * (k - len(t)))), prob))
    return out


def _every_tree(tree, draft_rows, k):
    parent, depth, children = tree
    internal = [i for i in range(len(parent)) if children[i]]

    def go(i, tokens, prob):
        if i == len(internal):
            yield tokens.copy(), prob
            return
        node = internal[i]
        if node != 0 and tokens[node] < 0:
            for c in children[node]:
                tokens[c] = -1
            yield from go(i + 1, tokens, prob)
            return
        for draw, weight in _child_tuples(draft_rows[depth[node]], k):
            for c, x in zip(children[node], draw, strict=True):
                tokens[c] = x
            yield from go(i + 1, tokens, prob * weight)

    yield from go(0, np.zeros(len(parent), dtype=np.int64), 1.0)


def _tree_sequence_law(p, q, k, m, length):
    """P(first ``length`` emitted tokens) of tree after tree of Traversal Verification, by enumeration."""
    tree = full_tree(k, m)
    parent = tree[0]
    memo = {}

    def path(tokens, node):
        out = []
        while node > 0:
            out.append(int(tokens[node]))
            node = parent[node]
        return tuple(reversed(out))

    def law_from(s):
        if s >= length:
            return {(): 1.0}
        if s not in memo:
            out = {}
            for tokens, weight in _every_tree(tree, p[s : s + m], k):
                stop, law = traverse(tree, tokens[None], p[None, s : s + m], q[None, s : s + m + 1], emitted=True)
                for node in np.flatnonzero(stop[0] > 0):
                    head = path(tokens, node)
                    for y in np.flatnonzero(law[0, node] > 0):
                        seq = (*head, int(y))
                        for tail, rest in law_from(s + len(seq)).items():
                            key = (seq + tail)[: length - s]
                            out[key] = out.get(key, 0.0) + weight * stop[0, node] * law[0, node, y] * rest
            memo[s] = out
        return memo[s]

    return law_from(0)


@pytest.mark.parametrize("k, m", [(2, 2), (3, 1), (2, 1)])
def test_traversal_trees_are_lossless_by_enumeration(k, m):
    for seed in range(3):
        rng = np.random.default_rng(seed)
        p = rng.dirichlet(np.full(3, 0.7), size=8)
        q = rng.dirichlet(np.full(3, 0.7), size=8)
        if seed == 2:  # a token the drafter never proposes, one the verifier excludes
            p[1, 0] = 0.0
            q[2, 1] = 0.0
            p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
        law = _tree_sequence_law(p, q, k, m, 3)
        for seq in itertools.product(range(3), repeat=3):
            want = np.prod([q[i, y] for i, y in enumerate(seq)])
            assert abs(law.get(seq, 0.0) - want) < 1e-12, (seed, seq)


def test_traversal_tree_lengths_against_enumerated_trees():
    rule = make_rule("traversal-tree(k=2)")
    p, q = _rows(4, 5, 3, sharp=0.6)
    m = 2
    tree = full_tree(2, m)
    exact = []
    for t in range(p.shape[0] - m + 1):
        total = 0.0
        rows_q = q[t : t + m + 1] if t + m < p.shape[0] else np.concatenate([q[t : t + m], q[-1:]])
        for tokens, weight in _every_tree(tree, p[t : t + m], 2):
            stop = traverse(tree, tokens[None], p[None, t : t + m], rows_q[None])
            total += weight * float(stop[0] @ tree[1])
        exact.append(total)
    _, mc, error = rule.expected_tree_lengths_for(p, q, (m,), n_paths=4000, seed=3)[m]
    assert np.all(np.abs(mc - np.array(exact)) <= 4.5 * error + 1e-9)
    # a tree of depth 1 is recursive rejection sampling without replacement: exact, against the enumerated trees
    method, one, error = rule.expected_tree_lengths_for(p, q, (1,), n_paths=4000, seed=4)[1]
    tree = full_tree(2, 1)
    by_trees = [
        sum(
            w * float(traverse(tree, tokens[None], p[None, t : t + 1], q[None, [t, t]])[0] @ tree[1])
            for tokens, w in _every_tree(tree, p[t : t + 1], 2)
        )
        for t in range(p.shape[0])
    ]
    assert method == "exact" and not error.any()
    np.testing.assert_allclose(one, by_trees, rtol=0, atol=1e-12)
    np.testing.assert_allclose(one, make_rule("rrs(k=2, replacement=false)").multi_acceptance(p, q), atol=1e-12)
    with pytest.raises(ValueError, match="nodes"):
        make_rule("traversal-tree(k=8)").expected_tree_lengths_for(p, q, (5,))


def test_the_analysis_takes_a_whole_tree_rules_own_lengths(tmp_path):
    from cactus_theory import SamplingSettings, analyze_trace
    from cactus_theory.traces import trace_from_arrays

    rng = np.random.default_rng(5)
    target = rng.normal(size=(24, 8)) * 1.5
    settings = {"temperature": 1.0, "top_k": 8, "top_p": 1.0}
    trace = trace_from_arrays(
        tmp_path / "t",
        target + rng.normal(size=target.shape),
        target,
        rng.integers(0, 8, size=24),
        sequence_lengths=[12, 12],
        top_k=8,
        metadata={"sampling": settings},
    )
    result = analyze_trace(
        trace, ["traversal-tree(k=2)", "rrs(k=2, replacement=false)"], ms=(2,), n_boot=0, block_paths=64
    )
    rows = {r["rule"]: r for r in result.rows if r["task"] == "all"}
    rule = make_rule("traversal-tree(k=2)")
    total, starts = 0.0, 0
    for seq, stats in zip(trace, sorted(result.sequences, key=lambda s: s.id), strict=True):
        p, q = seq.distributions(SamplingSettings(**settings))
        p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
        p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
        from cactus_theory.traces import prompt_seed

        _, values, _ = rule.expected_tree_lengths_for(p, q, (2,), n_paths=64, seed=prompt_seed(0, stats.id))[2]
        total, starts = total + values.sum(), starts + values.size
    assert rows["traversal-tree(k=2)"]["al"] == pytest.approx(total / starts, rel=1e-12)
    assert rows["traversal-tree(k=2)"]["al"] != pytest.approx(rows["rrs(k=2, replacement=false)"]["al"], rel=1e-9)
    with pytest.raises(ValueError, match="nodes"):
        analyze_trace(trace, ["traversal-tree(k=8)"], ms=(8,), n_boot=0)
    with pytest.raises(ValueError, match="judge whole blocks"):
        analyze_trace(trace, ["traversal-tree(k=2)"], ms=(2,), n_boot=0, draft_policies=["p-min(0.4)"])


@pytest.mark.parametrize("spec", ["hsd", "traversal", "traversal-tree(k=2)", "sglang-chain", "tli"])
def test_new_rules_pass_the_conformance_checks(spec):
    report = check_rule(spec)
    assert all(v == "passed" or v.startswith("skipped") for v in report.values()), report


# --- the engines' chain kernels --------------------------------------------------------------------


def test_sglang_chain_kernel_written_out():
    rule, sps = make_rule("sglang-chain"), make_rule("sps")
    rng = np.random.default_rng(0)
    p, q = _rows(2, 6, 5)
    p[0, 3], q[1, 2] = 0.0, 0.0
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    for row in range(6):
        for n in range(5):
            u = rng.random(20_000)
            rate = np.mean(u * p[row, n] < q[row, n])  # the kernel: accept iff coin * q_draft < p_target
            a = float(rule.acceptance(p[row], q[row], n))
            assert abs(rate - a) < 0.015
            np.testing.assert_allclose(a, float(sps.acceptance(p[row], q[row], n)), atol=0)
            residual = np.maximum(q[row] - p[row], 0.0)
            want = residual / residual.sum() if residual.sum() > 0 else q[row]
            np.testing.assert_allclose(rule.correction(p[row], q[row], n), want, atol=1e-15)


def test_vllm_kernel_without_draft_probabilities_is_strict_and_lossless_for_any_draft_law():
    rule = make_rule("strict")
    p, q = _rows(3, 4, 6)
    for row in range(4):
        for n in range(6):
            # NO_DRAFT_PROBS: draft_prob = 1, accept iff target_prob / 1 >= u; recovered: q with n zeroed
            np.testing.assert_allclose(float(rule.acceptance(p[row], q[row], n)), q[row, n], atol=0)
            rest = q[row].copy()
            rest[n] = 0.0
            np.testing.assert_allclose(rule.correction(p[row], q[row], n), rest / rest.sum(), atol=1e-15)
        pi = np.zeros(6)
        for n in range(6):
            rest = q[row].copy()
            rest[n] = 0.0
            pi += p[row, n] * (q[row, n] * np.eye(6)[n] + (1 - q[row, n]) * rest / rest.sum())
        np.testing.assert_allclose(pi, q[row], atol=1e-14)
        np.testing.assert_allclose(rule.emitted(p[row], q[row]), q[row], atol=0)


# --- heterogeneous vocabularies ----------------------------------------------------------------------


def test_vocabulary_map_projects_tli_draft_law():
    draft_vocab = {"Ġthe": 0, "cat": 1, "<d-only>": 2, "▁sat": 3}
    target_vocab = ["▁sat", "x", "▁the", "cat"]
    vmap = VocabularyMap.from_vocabularies(draft_vocab, target_vocab)
    assert vmap.draft_to_target.tolist() == [2, 3, -1, 0]
    assert vmap.shared.tolist() == [True, False, True, True]
    p = np.array([[0.4, 0.1, 0.3, 0.2], [0.0, 0.0, 1.0, 0.0]])
    np.testing.assert_allclose(vmap.shared_mass(p[:1]), [0.7])
    np.testing.assert_allclose(vmap.project(p[:1]), [[0.2 / 0.7, 0.0, 0.4 / 0.7, 0.1 / 0.7]])
    with pytest.raises(ValueError, match="no mass on a token the verifier shares"):
        vmap.project(p)
    q = np.array([0.1, 0.5, 0.2, 0.2])
    projected = vmap.project(p[0])
    accept = sum(projected[n] * float(make_rule("tli").acceptance(projected, q, n)) for n in range(4))
    np.testing.assert_allclose(accept, np.minimum(projected, q).sum(), rtol=1e-14)
    strict = VocabularyMap.from_vocabularies(draft_vocab, target_vocab, normalize=None)
    assert strict.draft_to_target.tolist() == [-1, 3, -1, 0]
    for bad, match in (
        (dict(draft_to_target=np.array([0, 0]), target_size=2), "one to one"),
        (dict(draft_to_target=np.array([0, 5]), target_size=2), r"\[-1, 2\)"),
        (dict(draft_to_target=np.array([0.5]), target_size=2), "integer array"),
        (dict(draft_to_target=np.array([0]), target_size=0), "target_size"),
    ):
        with pytest.raises(ValueError, match=match):
            VocabularyMap(**bad)
    with pytest.raises(ValueError, match="entries"):
        vmap.project(np.ones(3) / 3)
    with pytest.raises(ValueError, match="normalize"):
        VocabularyMap.from_vocabularies(["a"], ["a"], normalize="nfkc")
    # issue 43, item 15: a negative id was dropped (or IndexError), two tokens at one id lost one, an id of 10**12
    # asked for 7.28 TiB
    for bad, match in (
        ({"a": -1, "b": 0}, "token 'a' has id -1"),
        ({"a": 0, "b": 0}, "'a' and 'b' share id 0"),
        ({"a": 10**12}, "has id 1000000000000; ids are 0 to 16,777,215"),
    ):
        for args in ((bad, ["a", "b"]), (["a", "b"], bad)):
            with pytest.raises(ValueError, match=match):
                VocabularyMap.from_vocabularies(*args)


# --- adaptive verification ---------------------------------------------------------------------------


class _Cost:
    def __init__(self, draft, verify):
        self._draft, self._verify = draft, verify

    def draft_time(self, context=None):
        return self._draft

    def verify(self, k, context=None):
        return self._verify(k)


def test_adaptive_verify_length_by_brute_force():
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.full(6, 0.4), size=12)
    beta = rng.uniform(0.2, 1.0, size=12)
    cost = _Cost(0.3, lambda k: 1.0 + 0.15 * (k - 1) + 0.02 * (k - 1) ** 2)
    m = 5
    al, verified, forwards = policy_blocks(make_draft_policy("adaptive-verify"), p, beta, m, cost)
    top1 = p.max(-1)
    for t in range(12):
        fit = min(m, 12 - t)
        best, best_rate = 0, -1.0
        for length in range(fit + 1):
            tokens = 1.0 + sum(np.prod(top1[t : t + j + 1]) for j in range(length))
            rate = tokens / (fit * 0.3 + cost.verify(length + 1))
            if rate > best_rate + 1e-15:
                best, best_rate = length, rate
        every = np.prod(beta[t : t + best]) if best else 1.0  # all verified accepted: one more forward
        assert verified[t] == best and forwards[t] == pytest.approx(fit + every, rel=1e-12)
        np.testing.assert_allclose(al[t], sum(np.prod(beta[t : t + j + 1]) for j in range(best)), rtol=1e-12)
    with pytest.raises(ValueError, match="adaptive-verify needs a cost model"):
        policy_blocks(make_draft_policy("adaptive-verify"), p, beta, m)


def test_traversal_trees_too_big_are_refused_up_front_and_wide_ones_draft_every_token(capsys):
    """Issue 43, items 7 and 17: plan --rules traversal-tree with the default m grid (m = 12 and over pass MAX_NODES)
    ran past 60 s before refusing; analyze traversal-tree(k=2) --m 1 took 41 s; traversal-tree(k=200) --m 1 (201
    nodes) ended in a numpy shape mismatch: a row with fewer than k tokens drafts them all."""
    from cactus_theory import analyze_trace, load_trace
    from cactus_theory._cli import main

    assert main(["plan", "--rules", "traversal-tree", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "traversal-tree(k=2) at m = 12 has 8,191 nodes" in err and "give m up to 10 (--m)" in err
    # depth 1: the exact acceptance of rrs without replacement, averaged over positions (no Monte Carlo)
    trace = load_trace()
    result = analyze_trace(
        trace,
        ["traversal-tree(k=2)", "rrs(k=2, replacement=false)", "traversal-tree(k=200)"],
        ms=(1,),
        n_boot=0,
        tasks=["gsm8k"],
    )
    rows = {r["rule"]: r for r in result.rows if r["task"] == "all"}
    assert rows["traversal-tree(k=2)"]["al"] == pytest.approx(rows["rrs(k=2, replacement=false)"]["al"], rel=1e-12)
    # k = 200 drafts every token of a row: its AL is the chance that the verifier's token is among the drafter's
    # (p's support), at least k = 2's
    assert rows["traversal-tree(k=2)"]["al"] <= rows["traversal-tree(k=200)"]["al"] <= 1.0
    rng = np.random.default_rng(0)
    p = np.array([[0.5, 0.3, 0.2, 0.0]])
    tree = full_tree(200, 1)
    tokens = sample_tree(rng, tree, p[:, None, :].repeat(1, 0).reshape(1, 1, 4))
    assert sorted(tokens[0, 1:4]) == [0, 1, 2] and (tokens[0, 4:] == -1).all()
    stop = traverse(tree, tokens, p[None], np.array([[[0.1, 0.1, 0.1, 0.7], [0.1, 0.1, 0.1, 0.7]]]))
    # given the first draft x: accepted with min(1, q(x) / p(x)); after its rejection the verifier's residual is all
    # on token 3, which no draft holds: the other children are rejected
    first = tokens[0, 1]
    assert float(stop[0] @ tree[1]) == pytest.approx(min(1.0, 0.1 / p[0, first]), abs=1e-12)
