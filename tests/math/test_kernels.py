"""The compiled kernels (numba, the ``fast`` extra, installed in CI) against their NumPy twins."""

import math

import mpref
import numpy as np
import pytest

from cactus_theory import approx_gamma, exact_gamma
from cactus_theory._laws._emitted import _windowed_prefix_sums
from cactus_theory._math._kernels import HAVE_NUMBA, windowed_accepted_length, windowed_accepted_length_of_ratio

pytestmark = pytest.mark.fast  # the numba kernels


def test_numba_is_installed_for_the_tests():
    assert HAVE_NUMBA  # the README's test command installs the fast extra: no path goes untested


@pytest.mark.parametrize("m", [1, 2, 7, 8, 20, 64])
def test_windowed_accepted_length_equals_the_doubling_path(m):
    rng = np.random.default_rng(m)
    beta = rng.random((3, 257)) ** 0.2
    beta[0, 10:20] = 0.0
    beta[1, 50:] = 1.0
    np.testing.assert_allclose(windowed_accepted_length(beta, m), _windowed_prefix_sums(beta, m), rtol=1e-13, atol=0)


@pytest.mark.parametrize("delta", [None, 0.0, 0.3, 5.0])
def test_fused_acceptance_and_windows_equal_numpy(delta):
    rng = np.random.default_rng(2)
    q, p = rng.random(1000), rng.random(1000)
    p[::97] = 0.0
    q[::89] = 0.0
    g = q if delta is None else approx_gamma(q, delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = np.where(p > 0, np.minimum(g / p, 1.0), (g > 0).astype(float))
    got_beta, got_al = windowed_accepted_length_of_ratio(q, p, 8, delta)
    np.testing.assert_allclose(got_beta, beta, rtol=1e-15, atol=0)
    np.testing.assert_allclose(got_al, _windowed_prefix_sums(beta, 8), rtol=1e-13, atol=0)


def test_compiled_kl_gamma_is_the_largest_feasible_float_where_the_numpy_path_may_be_one_ulp_below():
    rng = np.random.default_rng(3)
    q = np.concatenate([rng.uniform(1e-6, 1 - 1e-6, 20000), 10.0 ** rng.uniform(-300, 0, 2000)])
    delta = np.concatenate([10.0 ** rng.uniform(-4, 1, 20000), 10.0 ** rng.uniform(-30, 3, 2000)])
    compiled, info = exact_gamma(q, delta, full_output=True)
    assert info.method == "compiled KL kernel"
    numpy_path = exact_gamma(q, delta, method="newton")
    # the compiled kernel certifies in double-double (bound 1e-26), the NumPy path in long double
    # (256 long-double ulp): where B(next float) lies within that band of delta, the compiled
    # kernel keeps the next float, which is the largest feasible one at 50 digits
    ulps = compiled.view(np.int64) - numpy_path.view(np.int64)
    assert set(np.unique(ulps)) <= {0, 1} and (ulps == 0).mean() > 0.9
    for i in np.flatnonzero(ulps)[:60]:
        assert mpref.binary("kl", float(compiled[i]), q[i]) <= delta[i]
        assert mpref.binary("kl", float(np.nextafter(compiled[i], 2.0)), q[i]) > delta[i]


def test_fast_mode_never_overspends_and_stays_within_the_float64_band():
    rng = np.random.default_rng(4)
    q = np.concatenate([rng.uniform(1e-6, 1 - 1e-6, 300), 10.0 ** rng.uniform(-12, 0, 100)])
    delta = 10.0 ** rng.uniform(-30, 1, 400)
    fast = exact_gamma(q, delta, tight=False)
    tight = exact_gamma(q, delta)
    for qi, di, fi, ti in zip(q, delta, fast, tight, strict=True):
        assert mpref.binary("kl", float(fi), qi) <= di  # never over, checked at 50 digits
        assert 0 <= (ti - fi) / math.ulp(ti) <= 32


def test_compiled_mentored_surrogate_equals_the_numpy_solver():
    from cactus_theory._math._row_kernels import mentored_rows
    from cactus_theory._rules.mentored import _BISECTIONS, _mentored_row

    rng = np.random.default_rng(6)
    for vocab, alpha in ((2, 1.0), (7, 0.3), (50, 0.1), (300, 1.0)):
        p, q = rng.dirichlet(np.full(vocab, alpha), size=20), rng.dirichlet(np.full(vocab, alpha), size=20)
        p[::3, 0] = 0.0
        q[::4, -1] = 0.0
        p /= p.sum(-1, keepdims=True)
        q /= q.sum(-1, keepdims=True)
        for delta in (1e-4, 0.05, 1.0, 20.0):
            want = np.stack([_mentored_row(pr, qr, delta) for pr, qr in zip(p, q, strict=True)])
            np.testing.assert_allclose(mentored_rows(p, q, delta, _BISECTIONS), want, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("rows, vocab", [(1, 5000), (3, 64), (64, 17)])  # serial and parallel kernels
@pytest.mark.parametrize("delta", [0.0, 0.05, 1.0, 40.0])
def test_compiled_emitted_distribution_equals_the_numpy_path(rows, vocab, delta):
    from cactus_theory._rules.cactus import emitted_drafted_bonus

    rng = np.random.default_rng(rows * vocab)
    p = rng.dirichlet(np.full(vocab, 0.3), size=rows)
    q = rng.dirichlet(np.full(vocab, 0.3), size=rows)
    p[:, ::7] = 0.0  # tokens the draft never proposes
    q[:, 1::11] = 0.0  # tokens the verifier excludes
    q[0, 2] = 0.0
    p[0, 2] = 0.0  # in neither support
    p /= p.sum(-1, keepdims=True)
    q /= q.sum(-1, keepdims=True)
    gamma = np.asarray(approx_gamma(q, delta))
    got = emitted_drafted_bonus(gamma, p, q)
    want = emitted_drafted_bonus(gamma, p, q, compiled=False)
    np.testing.assert_array_equal(got, want)  # the same sums in the same order
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=0, atol=1e-12)


def test_the_kernel_needs_few_evaluations_of_b_per_pair():
    # the series start and Halley's steps: about 1.4 float64 evaluations of B per pair on the
    # benchmark's distribution (3.1 with the Taylor start and Newton alone); a regression in the
    # search shows here before it shows in the benchmark
    rng = np.random.default_rng(0)
    q = rng.uniform(1e-6, 1 - 1e-6, 20000)
    delta = 10.0 ** rng.uniform(-4, 1, 20000)
    _, info = exact_gamma(q, delta, full_output=True)
    assert info.iterations.mean() < 1.6
    assert info.converged.all()


@pytest.mark.parametrize("name", ["chi2", "hellinger"])
def test_compiled_closed_forms_are_the_largest_feasible_float(name):
    from cactus_theory._math._gamma_kernels import exact_closed_gamma

    rng = np.random.default_rng(7)
    q = np.concatenate([rng.uniform(1e-6, 1 - 1e-6, 20000), 10.0 ** rng.uniform(-300, 0, 2000), [0.0, 1.0, 0.5, 0.3]])
    delta = np.concatenate(
        [10.0 ** rng.uniform(-4, 1, 20000), 10.0 ** rng.uniform(-30, 3, 2000), [0.5, 0.5, 0.0, np.inf]]
    )
    gamma, info = exact_gamma(q, delta, name, full_output=True)
    assert info.method == "closed-form inverse" and np.all(info.residual <= 0)
    _, status, _ = exact_closed_gamma(name, q, delta)
    assert (status[:20000] == 1).mean() < 1e-3  # the bulk decided in the kernel (the extremes may go on)
    numpy_path = exact_gamma(q, delta, name, method="newton")  # NumPy solve, long-double certification
    ulps = gamma.view(np.int64) - numpy_path.view(np.int64)
    assert set(np.unique(ulps)) <= {0, 1} and (ulps == 0).mean() > 0.9
    for i in list(np.flatnonzero(ulps)[:40]) + list(rng.choice(q.size, 40, replace=False)):
        assert mpref.binary(name, float(gamma[i]), q[i]) <= delta[i]
        if gamma[i] < 1.0 and status[i] == 0:
            assert mpref.binary(name, float(np.nextafter(gamma[i], 2.0)), q[i]) > delta[i]
    # the edges, as _exact_edges decides them
    assert gamma[-4] == (0.0 if name == "chi2" else gamma[-4]) and gamma[-3] == 1.0
    assert gamma[-2] == 0.5 and gamma[-1] == 1.0


@pytest.mark.parametrize("mode", ["per position", "per slot", "per start"])
def test_compiled_steps_of_a_batch_equal_the_banded_solve_and_each_sequence_alone(mode, monkeypatch):
    """The compiled walk over the steps decoding takes (``renewal_rows``) against its NumPy twin (one banded
    solve of the stacked sequences) and against ``renewal_steps`` of each sequence alone, with empty, short
    and long sequences, per-position, per-slot and per-start (a block rule's survival) laws."""
    from cactus_theory._laws._policies import fixed_blocks, renewal_steps, renewal_steps_many
    from cactus_theory._math import _kernels

    rng = np.random.default_rng(3)
    lengths = [5, 30, 2, 0, 17, 40, 1]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    n = int(offsets[-1])
    for m in (1, 3, 8):
        beta = rng.uniform(0, 1, (m, n)) if mode == "per slot" else rng.uniform(0, 1, n)
        survival = np.cumprod(rng.uniform(0, 1, (n, m)), axis=1) if mode == "per start" else None
        drafted, forwards = fixed_blocks(beta, offsets, m)
        drafted = np.minimum(drafted, rng.integers(0, m + 1, n))  # a policy's shorter blocks
        got = renewal_steps_many(
            None if survival is not None else beta, offsets, drafted, forwards, m, survival=survival
        )
        monkeypatch.setattr(_kernels, "_renewal_jit", None)
        twin = renewal_steps_many(
            None if survival is not None else beta, offsets, drafted, forwards, m, survival=survival
        )
        monkeypatch.undo()
        np.testing.assert_allclose(got, twin, rtol=1e-12, atol=1e-15)
        for i, length in enumerate(lengths):
            if not length:
                assert not got[i].any()
                continue
            span = slice(offsets[i], offsets[i + 1])
            first = 1 if length - m >= 1 else 0
            alone = renewal_steps(
                None if survival is not None else beta[..., span],
                drafted[span],
                forwards[span],
                m,
                start=first,
                stop=max(length - m, first),
                survival=None if survival is None else survival[span],
            )
            np.testing.assert_allclose(got[i], [*alone[:4], *alone[4]], rtol=1e-12, atol=1e-15)
