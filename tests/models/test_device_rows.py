"""Rows processed on the device (``_models._device_rows``): the random streams against splitmix64 written
out here, the processing against the definition row by row, sampling against the inverse of the
cumulative distribution, and the compressed rows against the host's ``compress_logits``."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from optional import torch
from sampling_reference import reference_probs

from cactus_theory import SamplingSettings
from cactus_theory._data._trace_format import compress_logits

pytestmark = pytest.mark.torch

MASK = (1 << 64) - 1


def splitmix64(seed, n):
    """The n-th output (n >= 0) of splitmix64 (Steele, Lea & Flood, OOPSLA 2014), Python integers."""
    z = (seed + (n + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


@given(seeds=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=5), start=st.integers(0, 2**40))
def test_uniforms_are_the_top_53_bits_of_splitmix64(seeds, start):
    from cactus_theory._models._device_rows import row_uniforms

    counters = np.arange(start, start + 7)
    got = row_uniforms(torch.tensor(seeds), torch.tensor(np.tile(counters, (len(seeds), 1))))
    want = [[(splitmix64(s, int(n)) >> 11) * 2.0**-53 for n in counters] for s in seeds]
    assert got.dtype == torch.float64
    np.testing.assert_array_equal(got.numpy(), np.array(want))  # bit for bit
    assert float(got.min()) >= 0 and float(got.max()) < 1


def test_a_stream_does_not_depend_on_the_rows_beside_it():
    from cactus_theory._models._device_rows import row_uniforms

    alone = row_uniforms(torch.tensor([123]), torch.tensor([[5, 6, 7]]))
    among = row_uniforms(torch.tensor([9, 123, 4]), torch.tensor([[1, 2, 3], [5, 6, 7], [0, 0, 0]]))
    assert torch.equal(alone[0], among[1])


SETTINGS = st.builds(
    SamplingSettings,
    temperature=st.sampled_from([0.0, 0.4, 1.0, 1.9]),
    top_k=st.sampled_from([0, 1, 3, 7, 30, 40]),
    top_p=st.sampled_from([1.0, 0.97, 0.6, 0.2]),
)


@given(seed=st.integers(0, 2**32 - 1), settings=SETTINGS, masked=st.booleans(), ties=st.booleans())
def test_processing_on_the_device_matches_the_definition(seed, settings, masked, ties):
    """Exact given the logits (float64 rows): ties with the k-th logit kept in index order, -inf tokens
    never kept, top-p over the stable descending order."""
    from cactus_theory._models._device_rows import process_rows

    rng = np.random.default_rng(seed)
    logits = rng.integers(-3, 4, size=(5, 40)).astype(float) if ties else rng.normal(0, 2, size=(5, 40))
    if masked:
        logits[rng.random(logits.shape) < 0.3] = -np.inf
        logits[:, 0] = 1.0  # every row keeps a finite logit
    probs, bad = process_rows(torch.tensor(logits), settings)
    want = reference_probs(logits, settings.temperature, settings.top_k, settings.top_p)
    np.testing.assert_allclose(probs.numpy(), want, rtol=1e-9, atol=1e-12)
    assert not bool(bad.any())


@given(seed=st.integers(0, 2**32 - 1), chain=st.sampled_from(["llama.cpp", "hf", "sglang", "vllm"]))
def test_processing_on_the_device_follows_any_chain(seed, chain):
    """Another engine's chain (or a min-p) on the device: the chain written out by plain loops."""
    from sampling_reference import reference_chain_probs

    from cactus_theory._math._sampling import CHAINS
    from cactus_theory._models._device_rows import process_rows

    logits = np.random.default_rng(seed).normal(0, 2, size=(4, 50))
    settings = SamplingSettings(temperature=0.7, top_k=9, top_p=0.6, min_p=0.1, chain=chain)
    probs, bad = process_rows(torch.tensor(logits), settings)
    want = reference_chain_probs(logits, 0.7, 9, 0.6, 0.1, CHAINS[chain])
    np.testing.assert_allclose(probs.numpy(), want, rtol=1e-9, atol=1e-12)
    assert not bool(bad.any())


def test_processing_flags_rows_with_nan_or_every_token_masked_and_shares_infinite_logits():
    from cactus_theory._models._device_rows import process_rows

    logits = torch.zeros(4, 6)
    logits[0, 2] = float("nan")
    logits[1] = -float("inf")
    logits[2, [1, 4]] = float("inf")  # +inf logits share the mass equally
    for settings in (SamplingSettings(1.0, 0, 1.0), SamplingSettings(0.5, 3, 0.9), SamplingSettings(0.0, 0, 1.0)):
        probs, bad = process_rows(logits, settings)
        assert bad.tolist() == [True, True, False, False]
        expected = [0, 1, 0, 0, 0, 0] if settings.greedy else [0, 0.5, 0, 0, 0.5, 0]
        np.testing.assert_allclose(probs[2].numpy(), expected, atol=1e-7)


def test_sampling_inverts_the_cumulative_distribution_and_never_draws_a_token_of_probability_zero():
    from cactus_theory._models._device_rows import sample_rows

    probs = torch.tensor([[0.0, 0.25, 0.0, 0.5, 0.25, 0.0]] * 7)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.5, 0.7499, 0.75, 1 - 2**-53], dtype=torch.float64)
    # cumulative sums 0, .25, .25, .75, 1, 1: the first index whose sum exceeds u
    assert sample_rows(probs, u).tolist() == [1, 1, 3, 3, 3, 4, 4]
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.ones(50), size=200) * (rng.random((200, 50)) < 0.3)
    rows[:, 7] += 1e-3  # no empty row
    drawn = sample_rows(torch.tensor(rows), torch.tensor(rng.random(200)))
    assert all(rows[i, t] > 0 for i, t in enumerate(drawn.tolist()))


@given(seed=st.integers(0, 2**32 - 1), k=st.sampled_from([1, 5, 16, 64]))
def test_compressed_rows_equal_the_hosts_in_a_fixed_order(seed, k):
    from cactus_theory._models._device_rows import compress_rows

    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(0, 2, size=(6, 40)), 1).astype(np.float32)  # rounded: many ties
    logits[0, 3:] = -np.inf
    values, ids, lse, nan = compress_rows(torch.tensor(logits), k)
    h_values, _, h_lse = compress_logits(logits, k)
    np.testing.assert_array_equal(values.numpy(), h_values)
    np.testing.assert_allclose(lse.numpy(), h_lse, rtol=1e-12)
    for r in range(6):  # each id holds its value; each row ordered by value, then id
        pairs = list(zip(-values[r].numpy(), ids[r].tolist(), strict=True))
        assert pairs == sorted(pairs)
        np.testing.assert_array_equal(logits[r, ids[r].numpy()], values[r].numpy())
    assert not bool(nan.any())
    assert bool(compress_rows(torch.tensor([[0.0, float("nan")]]), 1)[3][0])
