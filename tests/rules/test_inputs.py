"""Inputs as serving engines hand them over: float32 softmax rows over a real vocabulary, float16 /
bfloat16 tensors, infinite logits and extreme temperatures (issue 13, items 9 and 11)."""

import numpy as np
import pytest
from optional import torch

from cactus_theory import available_rules, make_rule, processed_probs, step_metrics
from cactus_theory._math._validation import normalisation_tolerance
from cactus_theory.rules import RuleLogits, optimal_multi_draft_acceptance

SPECS = list(available_rules())


@pytest.fixture(scope="module")
def softmax_rows():  # the tests that use it are marked torch
    gen = torch.Generator().manual_seed(0)
    zq = torch.randn(2, 151_936, generator=gen) * 3
    zp = zq + torch.randn(2, 151_936, generator=gen)
    p, q = torch.softmax(zp, dim=-1), torch.softmax(zq, dim=-1)  # float32, as an engine computes them
    return p, q, RuleLogits(target=zq, draft=zp, temperature=1.0)


@pytest.mark.torch
def test_a_float32_softmax_over_the_real_vocabulary_is_off_by_more_than_1e_6(softmax_rows):
    _p, q, _ = softmax_rows
    off = float(torch.max(torch.abs(q.double().sum(-1) - 1)))
    assert 1e-6 < off < normalisation_tolerance(float(torch.finfo(torch.float32).eps), 151_936)


@pytest.mark.torch
@pytest.mark.parametrize("spec", SPECS)
def test_every_rule_accepts_a_float32_softmax_row_of_151936_tokens(spec, softmax_rows):
    p, q, lg = softmax_rows
    rule = make_rule(spec)
    n = torch.argmax(p, dim=-1)
    a = rule.acceptance(p, q, n, logits=lg)
    r = rule.correction(p, q, n, logits=lg)
    assert a.dtype == torch.float32 and torch.all((a >= 0) & (a <= 1))
    assert torch.allclose(r.double().sum(-1), torch.ones(2, dtype=torch.float64), atol=1e-5)
    m = step_metrics(rule, p, q, logits=lg)
    np.testing.assert_allclose(m.emitted.sum(-1), 1.0, rtol=1e-12)


@pytest.mark.torch
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_every_rule_takes_low_precision_rows_through_step_metrics(spec, dtype_name):
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(1)
    zq, zp = torch.randn(3, 50, generator=gen) * 2, torch.randn(3, 50, generator=gen) * 2
    p, q = torch.softmax(zp, -1).to(dtype), torch.softmax(zq, -1).to(dtype)
    lg = RuleLogits(target=zq.to(dtype), draft=zp.to(dtype), temperature=1.0)
    m = step_metrics(make_rule(spec), p, q, logits=lg)
    assert np.all((m.acceptance >= 0) & (m.acceptance <= 1))
    np.testing.assert_allclose(m.emitted.sum(-1), 1.0, rtol=1e-12)


def test_tolerance_is_still_tight_for_float64():
    rule = make_rule("sps")
    p = np.full(4, 0.25)
    with pytest.raises(ValueError, match=r"must sum to 1 over its last axis \(tolerance 1e-06\)"):
        rule.acceptance(p, np.array([0.25, 0.25, 0.25, 0.2500011]), 0)


@pytest.mark.torch
def test_tolerance_for_float32_tensors():
    with pytest.raises(ValueError, match="must sum to 1"):
        make_rule("sps").acceptance(torch.full((4,), 0.25), torch.tensor([0.25, 0.25, 0.25, 0.26]), 0)


@pytest.mark.parametrize("backend_name", ["numpy", pytest.param("torch", marks=pytest.mark.torch)])
def test_infinite_logits_take_the_mass(backend_name):
    backend = np.asarray if backend_name == "numpy" else torch.as_tensor

    def probs(x, **kw):
        out = processed_probs(backend(np.array(x, dtype=np.float64)), **kw)
        return np.asarray(out, dtype=np.float64)

    np.testing.assert_array_equal(probs([np.inf, 0.0, 1.0], temperature=0.6, top_k=0, top_p=1.0), [1, 0, 0])
    np.testing.assert_array_equal(probs([np.inf, np.inf, 1.0], temperature=0.6, top_k=0, top_p=1.0), [0.5, 0.5, 0])
    np.testing.assert_array_equal(probs([np.inf, 0.0, 1.0], temperature=0.0), [1, 0, 0])
    greedy = probs([-np.inf, 0.0, 1.0], temperature=0.0)  # -inf entries used to give NaN in greedy rows
    np.testing.assert_array_equal(greedy, [0, 0, 1])
    tiny = probs([0.5, 0.2, 0.1], temperature=1e-310, top_k=0, top_p=1.0)  # the greedy limit, no overflow
    np.testing.assert_array_equal(tiny, [1, 0, 0])
    with pytest.raises(ValueError, match=r"logits row \(1,\) is -inf everywhere"):
        processed_probs(backend(np.array([[0.0, 1.0], [-np.inf, -np.inf]])), temperature=1.0)
    with pytest.raises(ValueError, match="NaN"):
        processed_probs(backend(np.array([0.0, np.nan])), temperature=1.0)


@pytest.mark.torch
def test_half_precision_rows_work_where_step_metrics_accepts_them():
    import torch

    p = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]])
    q = np.array([[0.3, 0.3, 0.4], [0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])
    sps = make_rule("sps")
    want = sps.block_law(p[:2], q, np.array([0, 1])).accepted
    for dtype in (torch.float16, torch.bfloat16):
        pt, qt = torch.tensor(p).to(dtype), torch.tensor(q).to(dtype)
        step_metrics(sps, pt, qt)  # accepted, as before
        got = sps.block_law(pt[:2], qt, np.array([0, 1])).accepted
        np.testing.assert_allclose(got, want, atol=0.02)
        np.testing.assert_allclose(
            optimal_multi_draft_acceptance(pt, qt, 2), optimal_multi_draft_acceptance(p, q, 2), atol=0.02
        )
    np.testing.assert_allclose(
        sps.block_law(p[:2].astype(np.float16), q.astype(np.float16), np.array([0, 1])).accepted, want, atol=2e-3
    )
