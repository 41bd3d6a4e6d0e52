"""The sampler chains: every engine's order of temperature, top-k, top-p and min-p, against the chain written
out by plain loops (``sampling_reference``), against llama.cpp's own sampler objects and transformers' own
warpers on fixed logits, and the settings' checks and stored form."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sampling_reference import reference_chain_probs

from cactus_theory import SamplingSettings, processed_probs
from cactus_theory._math._sampling import CHAINS, STEPS


def _row(seed, vocab=60):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=vocab) * rng.uniform(0.5, 4)).astype(np.float32).astype(np.float64)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    chain=st.sampled_from(sorted(CHAINS)),
    temperature=st.sampled_from([0.0, 0.3, 0.6, 1.0, 1.7]),
    top_k=st.integers(0, 70),
    top_p=st.sampled_from([0.3, 0.8, 0.95, 1.0]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
)
def test_every_named_chain_is_its_steps_in_order(seed, chain, temperature, top_k, top_p, min_p):
    logits = _row(seed)[None]
    s = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, chain=chain)
    want = reference_chain_probs(logits, temperature, top_k, top_p, min_p, CHAINS[chain])
    np.testing.assert_allclose(processed_probs(logits, s), want, rtol=1e-12, atol=1e-15)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10_000), order=st.permutations(["temperature", "top_k_exact", "top_p", "min_p"]))
def test_a_users_chain_is_its_steps_in_order(seed, order):
    logits = _row(seed, 500)[None]  # large enough for the candidates-only path where top-k comes first
    s = SamplingSettings(temperature=0.7, top_k=12, top_p=0.6, min_p=0.1, chain=tuple(order))
    want = reference_chain_probs(logits, 0.7, 12, 0.6, 0.1, order)
    np.testing.assert_allclose(processed_probs(logits, s), want, rtol=1e-12, atol=1e-15)
    assert s.support_within(12) == (order.index("top_k_exact") < order.index("top_p"))


def test_the_chains_differ_where_the_order_matters():
    """top-p on the untempered law (llama.cpp) keeps what top-p on the tempered one (vLLM) drops; min-p before
    top-p (vLLM) and after it (Hugging Face) keep different sets. Each value worked out by hand."""
    logits = np.log([0.5, 0.3, 0.15, 0.05])
    # llama.cpp: top-3 renormalised 0.526, 0.316, 0.158; mass before the second 0.526 < 0.6: two kept; then
    # temperature 0.5: 0.25 / 0.34, 0.09 / 0.34
    got = processed_probs(logits, temperature=0.5, top_k=3, top_p=0.6, chain="llama.cpp")
    np.testing.assert_allclose(got, [0.25 / 0.34, 0.09 / 0.34, 0, 0], rtol=1e-12)
    # vLLM: tempered first (0.25, 0.09, 0.0225 over 0.3625): the mass before the second 0.69 >= 0.6: one kept
    np.testing.assert_allclose(processed_probs(logits, temperature=0.5, top_k=3, top_p=0.6), [1, 0, 0, 0])
    # min-p 0.4 at temperature 1: 0.15 / 0.5 = 0.3 < 0.4 drops the third; vLLM's top-p 0.9 then runs over the
    # first two (0.625, 0.375: both kept); Hugging Face's over the first three (0.526, 0.316, 0.158: the mass
    # before the third 0.842 < 0.9 keeps it, and min-p drops it after): the same two here
    for chain in ("vllm", "hf"):
        got = processed_probs(logits, temperature=1.0, top_k=3, top_p=0.9, min_p=0.4, chain=chain)
        np.testing.assert_allclose(got, [0.625, 0.375, 0, 0], rtol=1e-12)
    # top-p 0.8 then min-p (hf): top-p keeps 0.5, 0.3 of the law 0.5, 0.3, 0.15, 0.05 (mass before 0.8);
    # min-p first (vllm) keeps 0.5, 0.3, renormalised 0.625, 0.375, and top-p 0.5 keeps only the first
    assert processed_probs(logits, temperature=1.0, top_k=0, top_p=0.5, min_p=0.4, chain="vllm")[1] == 0
    hf = processed_probs(logits, temperature=1.0, top_k=0, top_p=0.55, min_p=0.4, chain="hf")
    np.testing.assert_allclose(hf, [0.625, 0.375, 0, 0], rtol=1e-12)


def test_llama_cpp_keeps_exactly_k_and_breaks_ties_by_the_lower_id():
    logits = np.array([1.0, 3.0, 2.0, 2.0, 2.0, 0.0])
    got = processed_probs(logits, temperature=1.0, top_k=2, top_p=1.0, chain="llama.cpp")
    np.testing.assert_allclose(got, np.array([0, np.e, 1, 0, 0, 0]) / (np.e + 1), rtol=1e-12)
    kept = processed_probs(logits, temperature=1.0, top_k=2, top_p=1.0)  # vLLM keeps every tie of the 2nd
    assert (kept > 0).tolist() == [False, True, True, True, True, False]


def test_settings_are_checked_and_stored_as_before_where_they_are_the_defaults():
    assert SamplingSettings().as_dict() == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    s = SamplingSettings(min_p=0.05, chain=("top_k", "temperature", "top_p", "min_p"))
    assert s.as_dict()["chain"] == ["top_k", "temperature", "top_p", "min_p"]
    assert SamplingSettings.from_dict(s.as_dict()) == s
    assert SamplingSettings.from_dict({"chain": "llama.cpp", "min_p": 0.05}).steps == CHAINS["llama.cpp"]
    assert (
        "chain llama.cpp (top_k_exact > top_p > min_p > temperature)" in SamplingSettings(chain="llama.cpp").describe()
    )
    for bad, match in (
        ({"chain": "tgi"}, "chain must be one of vllm, hf, sglang, llama.cpp"),
        ({"chain": ("top_k", "top_p")}, "applies the temperature"),
        ({"chain": ("temperature", "top_k", "top_k")}, "each step at most once"),
        ({"chain": ("temperature", "top_k", "top_k_exact")}, "one top-k"),
        ({"chain": ("temperature", "top_k", "bogus")}, "unknown step"),
        ({"chain": ("temperature", "top_k")}, "has no step for top_p"),
        ({"min_p": 1.0}, "min_p must lie in"),
        ({"min_p": float("nan")}, "min_p must lie in"),
        ({"min_p": "0.1"}, "min_p must be a number"),
    ):
        with pytest.raises(ValueError, match=match):
            SamplingSettings(**bad)
    with pytest.raises(ValueError, match="sampling has unknown field"):
        SamplingSettings.from_dict({"typical_p": 0.9})
    assert set(STEPS) >= {s for steps in CHAINS.values() for s in steps}


def test_support_within_says_when_the_top_logits_decide_the_law():
    assert SamplingSettings(top_k=20).support_within(64)
    assert not SamplingSettings(top_k=65).support_within(64)
    assert not SamplingSettings(top_k=0).support_within(64)
    assert SamplingSettings(temperature=0.0, top_k=0).support_within(1)
    assert SamplingSettings(top_k=20, chain="llama.cpp", min_p=0.05).support_within(20)
    assert not SamplingSettings(top_k=20, chain=("temperature", "top_p", "top_k")).support_within(64)


@pytest.mark.llamacpp
def test_llama_cpps_chain_is_llama_cpps_own_samplers():
    """llama.cpp's top-k, top-p, min-p and temperature samplers (llama-cpp-python's sampler API, no model) on
    fixed logits keep the same tokens and give the same law (llama.cpp computes in float32)."""
    import ctypes

    llama_cpp = pytest.importorskip("llama_cpp")
    rng = np.random.default_rng(7)
    for case in range(120):
        logits = _row(case, 300)
        temperature = float(rng.choice([0.3, 0.6, 1.0, 1.5]))
        top_k, top_p = int(rng.integers(1, 60)), float(rng.choice([0.5, 0.8, 0.95, 1.0]))
        min_p = float(rng.choice([0.0, 0.05, 0.2]))
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        for sampler in (
            llama_cpp.llama_sampler_init_top_k(top_k),
            llama_cpp.llama_sampler_init_top_p(top_p, 0),
            llama_cpp.llama_sampler_init_min_p(min_p, 0),
            llama_cpp.llama_sampler_init_temp(temperature),
        ):
            llama_cpp.llama_sampler_chain_add(chain, sampler)
        data = (llama_cpp.llama_token_data * logits.size)()
        for i, value in enumerate(logits):
            data[i].id, data[i].logit, data[i].p = i, float(value), 0.0
        cur = llama_cpp.llama_token_data_array(data=data, size=logits.size, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(cur))
        ids = np.array([cur.data[i].id for i in range(cur.size)])
        values = np.array([cur.data[i].logit for i in range(cur.size)], dtype=np.float64)
        llama_cpp.llama_sampler_free(chain)
        theirs = np.zeros(logits.size)
        theirs[ids] = np.exp(values - values.max()) / np.exp(values - values.max()).sum()
        settings_ = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, chain="llama.cpp")
        ours = processed_probs(logits, settings_)
        assert ((ours > 0) == (theirs > 0)).all(), case
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


@pytest.mark.models
def test_hugging_faces_chain_is_its_own_warpers():
    """transformers' temperature, top-k, top-p and min-p warpers, in the order ``generate`` builds them."""
    torch = pytest.importorskip("torch")
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(3)
    for case in range(60):
        logits = _row(case, 200)
        temperature = float(rng.choice([0.3, 0.6, 1.5]))
        top_k, top_p, min_p = int(rng.integers(1, 40)), float(rng.choice([0.5, 0.9])), float(rng.choice([0.05, 0.2]))
        scores = torch.tensor(logits)[None]
        for warper in (
            TemperatureLogitsWarper(temperature),
            TopKLogitsWarper(top_k),
            TopPLogitsWarper(top_p),
            MinPLogitsWarper(min_p),
        ):
            scores = warper(None, scores)
        theirs = torch.softmax(scores, -1)[0].numpy()
        s = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, chain="hf")
        ours = processed_probs(logits, s)
        assert ((ours > 0) == (theirs > 0)).all(), case
        np.testing.assert_allclose(ours, theirs, atol=1e-12)
