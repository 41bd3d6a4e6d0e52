"""A rule's torch path compiled (``FusedRule``): its acceptance and correction against the rule's law written
out step by step in NumPy float64 (SpS: min(1, q(n)/p(n)) and norm((q - p)+); Cactus with the Taylor bonus:
gamma = min(1, q(n) + sqrt(2 delta q(n)(1 - q(n))), h = q scaled by (1 - gamma)/(1 - q(n)) off n, gamma at n,
then min(1, h(n)/p(n)) and norm((h - p)+)), on rows that include the branch the eager path repairs after the
call (no residual mass: h normalised) and drafts the target excludes."""

import numpy as np
import pytest
from optional import torch

from cactus_theory import Cactus, SpS
from cactus_theory.rules import FusedRule

pytestmark = pytest.mark.models  # torch.compile: the models' extra


def _rows(seed, rows=6, vocab=40):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.3), size=rows)
    q = rng.dirichlet(np.full(vocab, 0.3), size=rows)
    q[0] = p[0]  # no residual mass for SpS: its correction is q itself
    q[1, 3] = 0.0  # a draft the target excludes
    q[1] /= q[1].sum()
    n = rng.integers(0, vocab, size=rows)
    n[1] = 3
    return p, q, n


def _law(name, p, q, n, delta=1.0):
    rows = np.arange(len(n))
    pn, qn = p[rows, n], q[rows, n]
    if name == "sps":
        h = q.copy()
    else:
        gamma = np.minimum(1.0, qn + np.sqrt(2 * delta * qn * (1 - qn)))
        h = q * ((1 - gamma) / (1 - qn))[:, None]
        h[rows, n] = gamma
    hn = h[rows, n]
    accept = np.where(pn > 0, np.minimum(1.0, hn / np.where(pn > 0, pn, 1.0)), (hn > 0) * 1.0)
    r = np.maximum(h - p, 0.0)
    z = r.sum(-1, keepdims=True)
    correction = np.where(z > 0, r / np.where(z > 0, z, 1.0), h / h.sum(-1, keepdims=True))
    return accept, correction


@pytest.mark.parametrize(("name", "rule"), [("sps", SpS()), ("cactus", Cactus(1.0))])
def test_a_fused_rule_gives_the_rule_s_law(name, rule):
    fused = FusedRule(rule)
    for seed in (0, 1):  # a second call of the same shape replays the compiled graph
        p, q, n = _rows(seed)
        accept, correction = fused.acceptance_and_correction(torch.tensor(p), torch.tensor(q), torch.tensor(n))
        want_accept, want_correction = _law(name, p, q, n)
        np.testing.assert_allclose(accept.numpy(), want_accept, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(correction.numpy(), want_correction, rtol=1e-12, atol=1e-15)
    if name == "sps":
        np.testing.assert_allclose(correction.numpy()[0], q[0], rtol=1e-12)  # the repaired row: q
    p32, q32, n = _rows(2)
    accept, correction = fused.acceptance_and_correction(
        torch.tensor(p32, dtype=torch.float32), torch.tensor(q32, dtype=torch.float32), torch.tensor(n)
    )
    want_accept, want_correction = _law(name, p32, q32, n)
    np.testing.assert_allclose(accept.numpy(), want_accept, atol=1e-5)  # float32 rows: float32's tolerance
    np.testing.assert_allclose(correction.numpy(), want_correction, atol=1e-5)
    assert fused.describe() == rule.describe() and fused.at_slot(0).describe() == rule.at_slot(0).describe()


def test_a_fused_rule_refuses_validation_and_logit_rules():
    fused = FusedRule(SpS())
    p, q, n = (torch.tensor(x) for x in _rows(0))
    with pytest.raises(ValueError, match="a fused rule does not validate its rows"):
        fused.acceptance_and_correction(p, q, n, validate=True)
    from cactus_theory.rules import make_rules

    logit_rules = [r for r in make_rules("entropy-verify,relaxed-topk,scd") if r.needs_logits]
    assert len(logit_rules) == 3
    for rule in logit_rules:
        with pytest.raises(ValueError, match="reads raw logits"):
            FusedRule(rule)
