"""cactus_surrogate: the Theorem 2 construction, NumPy and torch, edge cases and bad input."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from optional import torch

from cactus_theory import cactus_surrogate


@given(seed=st.integers(0, 2**32 - 1), size=st.integers(2, 40), gamma=st.floats(0, 1))
def test_construction(seed, size, gamma):
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.ones(size))
    n = int(rng.integers(size))
    h = cactus_surrogate(q, n, gamma)
    assert h[n] == gamma
    others = np.delete(np.arange(size), n)
    # every other token keeps its share of the remaining mass (brute force, per element)
    for x in others:
        np.testing.assert_allclose(h[x], q[x] * (1 - gamma) / (1 - q[n]), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(h.sum(), 1.0, rtol=1e-14)


def test_q_of_n_equal_one_is_one_hot():
    q = np.array([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    h = cactus_surrogate(q, np.array([1, 2]), np.array([1.0, 0.6]))
    np.testing.assert_array_equal(h[0], [0.0, 1.0, 0.0])
    np.testing.assert_allclose(h[1], [0.16, 0.24, 0.6], rtol=1e-15)


def test_near_one_keeps_digits():
    # 1 - q(n) is taken as the other tokens' mass: exact even when q(n) rounds to 1
    q = np.array([1e-20, 1 - 1e-20, 0.0])
    assert q[1] == 1.0
    h = cactus_surrogate(q, 1, 0.5)
    np.testing.assert_array_equal(h, [0.5, 0.5, 0.0])


@pytest.mark.torch
@pytest.mark.parametrize("dtype_name", ["float64", "float32", "float16", "bfloat16"])
def test_torch_matches_numpy_and_keeps_dtype(dtype_name):
    dtype = getattr(torch, dtype_name)
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.ones(16), size=(3, 4))
    n = rng.integers(16, size=(3, 4))
    gamma = rng.uniform(size=(3, 4))
    q_t = torch.as_tensor(q, dtype=dtype)
    q_t = q_t / q_t.sum(-1, keepdim=True)
    h_t = cactus_surrogate(q_t, torch.as_tensor(n), torch.as_tensor(gamma))
    assert h_t.dtype == dtype and h_t.shape == (3, 4, 16)
    q_ref = q_t.double().numpy()
    h_np = cactus_surrogate(q_ref / q_ref.sum(-1, keepdims=True), n, gamma)
    tol = {"float64": 1e-14, "float32": 1e-6, "float16": 2e-3, "bfloat16": 2e-2}[dtype_name]
    np.testing.assert_allclose(h_t.double().numpy(), h_np, rtol=tol, atol=tol)


def test_bad_input():
    q = np.array([0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match=r"drafted_token must lie in \[0, 3\)"):
        cactus_surrogate(q, 3, 0.5)
    with pytest.raises(ValueError, match="drafted_token must be integer"):
        cactus_surrogate(q, 1.0, 0.5)
    with pytest.raises(ValueError, match=r"gamma must be probabilities in \[0, 1\]"):
        cactus_surrogate(q, 1, 1.5)
    with pytest.raises(ValueError, match="target_probs must sum to 1"):
        cactus_surrogate(q * 2, 1, 0.5)
    with pytest.raises(ValueError, match="does not match the batch shape"):
        cactus_surrogate(np.tile(q, (2, 1)), np.array([0, 1, 2]), 0.5)


@pytest.mark.torch
def test_backends_are_not_mixed():
    with pytest.raises(ValueError, match="mix NumPy arrays and torch tensors"):
        cactus_surrogate(torch.as_tensor(np.array([0.2, 0.3, 0.5])), np.array(1), 0.5)
