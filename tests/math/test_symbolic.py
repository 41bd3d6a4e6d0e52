"""Symbolic derivations reproduce the paper's closed form and the 1/f''(1) scaling."""

import mpmath as mp
import mpref
import numpy as np
import pytest
import sympy as sp

from cactus_theory import approx_gamma, exact_gamma, generator_facts, symbolic_gamma


def _equal_at_rationals(expr_a, expr_b, q, delta):
    for qv in (sp.Rational(1, 7), sp.Rational(1, 2), sp.Rational(9, 10)):
        for dv in (sp.Rational(1, 1000), sp.Rational(3, 4)):
            diff = (expr_a - expr_b).subs({q: qv, delta: dv})
            assert abs(sp.N(diff, 60)) < sp.Float(10) ** -50


def test_kl_order_2_is_corollary_5():
    sg = symbolic_gamma("kl")
    _equal_at_rationals(sg.expr, sg.q + sp.sqrt(2 * sg.delta * sg.q * (1 - sg.q)), sg.q, sg.delta)
    assert sp.simplify(sg.coefficients[0] - 1 / (2 * sg.q * (1 - sg.q))) == 0


@pytest.mark.parametrize(("name", "f2"), [("chi2", 2), ("hellinger", sp.Rational(1, 2)), ("js", sp.Rational(1, 4))])
def test_increment_scales_as_one_over_f_second(name, f2):
    sg, kl = symbolic_gamma(name), symbolic_gamma("kl")
    ratio = sp.simplify(((sg.expr - sg.q) / (kl.expr - kl.q)) ** 2)
    assert sp.simplify(ratio - 1 / f2) == 0


def test_order_3_matches_the_numeric_closed_form():
    q = np.linspace(0.05, 0.95, 19)
    for name in ("kl", "reverse_kl", "hellinger", "js"):
        sg3 = symbolic_gamma(name, order=3)
        np.testing.assert_allclose(sg3.func(q, 1e-3), approx_gamma(q, 1e-3, name, method="taylor3"), rtol=1e-14)


@pytest.mark.parametrize("order", [2, 3, 4, 5])
def test_error_of_order_k_shrinks_as_delta_to_the_k_minus_1_over_2(order):
    """gamma_order - gamma* = O(delta^((order)/2)): check the slope of the error in delta."""
    sg = symbolic_gamma("kl", order=order)
    q = 0.3
    deltas = [1e-4, 1e-5]
    errs = [abs(mp.mpf(float(sg.func(q, d))) - mpref.gamma_star("kl", q, d)) for d in deltas]
    slope = float(mp.log10(errs[0] / errs[1]))
    assert slope == pytest.approx(order / 2, abs=0.15)


def test_user_expression_and_its_facts():
    facts = generator_facts("(t - 1)**2 / t")  # Neyman chi2
    assert facts.f_second_at_one == 2.0 and facts.slope_at_infinity == 1.0
    sg = symbolic_gamma("(t - 1)**2 / t")
    np.testing.assert_allclose(sg.func(0.4, 0.0), 0.4)
    # the Taylor gamma approaches the exact one for the same user divergence as delta -> 0
    from cactus_theory import FDivergence

    neyman = FDivergence.from_sympy("neyman", facts.expr, facts.t)
    np.testing.assert_allclose(sg.func(0.4, 1e-8), exact_gamma(0.4, 1e-8, neyman), rtol=1e-7)
    assert sg.latex.startswith("q +") or "q" in sg.latex


def test_bad_generators():
    with pytest.raises(ValueError, match="f''\\(1\\) = 0"):
        symbolic_gamma("t - 1")
    with pytest.raises(ValueError, match="exactly one free symbol"):
        symbolic_gamma(sp.Symbol("a") * sp.Symbol("b"))
    with pytest.raises(ValueError, match="could not parse"):
        symbolic_gamma("t**")
    with pytest.raises(ValueError, match="order must be"):
        symbolic_gamma("kl", order=7)
