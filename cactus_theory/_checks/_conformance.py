"""The conformance checks every acceptance rule passes (``check_rule``, the public face
``cactus_theory.testing``): each a named function over random inputs, a failure an ``AssertionError``
naming the check, the rule and the input."""

from __future__ import annotations

import dataclasses

import numpy as np

from .._laws._emitted import emitted_distribution, expected_accepted_length, step_metrics
from .._laws._sequence import sequence_law, sequence_tv, sequence_tv_rows, small_cases
from .._laws._simulate import simulate
from .._math._logits import RuleLogits
from .._math._validation import check_int
from .._rules import available_rules, make_rule
from .._rules._protocol import judgement_of
from .._rules._reference import emitted_bruteforce
from ._blocks import (
    _multi,
    check_block_at_least_token,
    check_block_lossless,
    check_block_monte_carlo,
    check_block_survival,
    check_multi_below_optimum,
    check_multi_enumeration,
    check_multi_single_draft,
    check_multi_verify,
)
from ._tools import (
    _chi_square_p_value,
    _close,
    _Failed,
    _finite_probabilities,
    _logits_for,
    _position_rows,
    _torch,
    _true,
    make_case,
)

__all__ = [
    "CHECKS",
    "check_rule",
    "check_sane",
    "conformance_rules",
    "emitted_bruteforce",
    "make_case",
    "same_rules",
    "sequence_law",
    "sequence_tv",
    "sequence_tv_rows",
    "small_cases",
]


# --- the checks ----------------------------------------------------------------------------------


def check_sane(rule, seed):
    """What every check needs first: the rule's numbers on one random input are finite
    probabilities (acceptance in [0, 1], a correction and an emitted law that are distributions;
    for a block rule its block law, for a multi-draft rule its acceptance over the drafts).
    ``check_rule`` runs it before each check, so no check passes a rule whose numbers are NaN."""
    vocab = int(np.random.default_rng(seed).integers(3, 8))
    p, q, lg = make_case(seed, vocab, batch=(2,))
    n = np.random.default_rng(seed + 2).integers(vocab, size=2)
    lg = _logits_for(rule, lg)
    single = rule.single() if _multi(rule) else rule
    _finite_probabilities(single.acceptance(p, q, n, logits=lg), "acceptance", p=p, q=q, n=n)
    r = np.asarray(single.correction(p, q, n, logits=lg), dtype=np.float64)
    _finite_probabilities(r, "a correction", p=p, q=q, n=n)
    _close(r.sum(-1), 1.0, "a correction does not sum to 1", rtol=1e-9, atol=0, p=p, q=q, n=n)
    pi = np.asarray(emitted_distribution(rule, p, q, logits=lg), dtype=np.float64)
    _finite_probabilities(pi, "the emitted law", p=p, q=q)
    _close(pi.sum(-1), 1.0, "the emitted law does not sum to 1", rtol=1e-9, atol=0, p=p, q=q)
    if _multi(rule):
        _finite_probabilities(rule.multi_acceptance(p, q), "the acceptance over the drafts", p=p, q=q)
    if judgement_of(rule).block and not rule.needs_logits:
        rows_p, rows_q = _position_rows(seed, 3, vocab)
        law = rule.block_law(rows_p[:2], rows_q, np.array([0, 1]))
        _finite_probabilities(law.accepted, "the block law's accepted lengths", p=rows_p, q=rows_q)
        _close(
            law.accepted.sum(-1),
            1.0,
            "the block law's accepted lengths do not sum to 1",
            rtol=1e-9,
            atol=0,
            p=rows_p,
            q=rows_q,
        )
    return None


def check_probabilities(rule, seed):
    """Acceptance in [0, 1] (0 or 1 for a deterministic rule); corrections are distributions."""
    vocab = int(np.random.default_rng(seed).integers(2, 10))
    p, q, lg = make_case(seed, vocab, batch=(3,))
    n = np.random.default_rng(seed + 1).integers(vocab, size=3)
    lg = _logits_for(rule, lg)
    a = np.asarray(rule.acceptance(p, q, n, logits=lg))
    _true(a.shape == (3,), f"acceptance has shape {a.shape}, expected (3,)", p=p, q=q, n=n)
    _true((a >= 0) & (a <= 1), f"acceptance {a} outside [0, 1]", p=p, q=q, n=n)
    if rule.deterministic:
        _true(np.isin(a, (0.0, 1.0)), f"a deterministic rule gave acceptance {a}", p=p, q=q, n=n)
    r = np.asarray(rule.correction(p, q, n, logits=lg))
    _true(r.shape == (3, vocab), f"correction has shape {r.shape}, expected {(3, vocab)}", p=p, q=q, n=n)
    _true(r >= 0, "a correction has a negative entry", p=p, q=q, n=n, correction=r)
    _close(r.sum(-1), 1.0, "a correction does not sum to 1", rtol=1e-12, atol=0, p=p, q=q, n=n)


def check_bonus_laws(rule, seed):
    """The verifier bonus law is q; the relaxed one is the rule's emitted law."""
    p, q, lg = make_case(seed, int(np.random.default_rng(seed).integers(2, 10)), batch=(2,))
    lg = _logits_for(rule, lg)
    _close(rule.bonus_distribution(p, q), q, "bonus_distribution(policy='verifier') is not q", p=p, q=q)
    relaxed = rule.bonus_distribution(p, q, policy="relaxed", logits=lg)
    _close(
        relaxed, emitted_distribution(rule, p, q, logits=lg), "the relaxed bonus law is not the emitted law", p=p, q=q
    )


def check_acceptance_all(rule, seed):
    """``acceptance_all`` agrees with ``acceptance`` token by token; no rule accepts a token both
    models exclude."""
    vocab = int(np.random.default_rng(seed).integers(2, 10))
    p, q, lg = make_case(seed, vocab, batch=(3,))
    lg = _logits_for(rule, lg)
    all_a = rule.acceptance_all(p, q, logits=lg)
    for token in range(vocab):
        n = np.full(3, token)
        _close(
            all_a[:, token],
            rule.acceptance(p, q, n, logits=lg),
            f"acceptance_all[..., {token}] != acceptance",
            rtol=1e-13,
            atol=1e-15,
            p=p,
            q=q,
            n=n,
        )
    _true(all_a[(p == 0) & (q == 0)] == 0, "a token both models exclude is accepted", p=p, q=q)


def check_emitted_matches_bruteforce(rule, seed):
    """The emitted law (the rule's fast algorithm) equals the O(V^2) loop over drafted tokens and is
    a distribution."""
    p, q, lg = make_case(seed, int(np.random.default_rng(seed).integers(2, 13)), batch=(2,))
    lg = _logits_for(rule, lg)
    fast = emitted_distribution(rule, p, q, logits=lg)
    _close(fast, emitted_bruteforce(rule, p, q, logits=lg), "the emitted law differs from the brute force", p=p, q=q)
    _true(fast >= 0, "the emitted law has a negative entry", p=p, q=q)
    _close(fast.sum(-1), 1.0, "the emitted law does not sum to 1", rtol=1e-12, atol=0, p=p, q=q)


def check_lossless(rule, seed):
    """A rule that declares itself lossless emits q exactly."""
    if not rule.lossless:
        return "not lossless"
    p, q, lg = make_case(seed, int(np.random.default_rng(seed).integers(2, 13)), batch=(3,))
    _close(
        emitted_distribution(rule, p, q, logits=_logits_for(rule, lg)),
        q,
        "a lossless rule does not emit q",
        atol=1e-12,
        p=p,
        q=q,
    )
    return None


def check_drafter_without_probabilities(rule, seed):
    """``draft_probs=None`` (a drafter without probabilities) is one-hot on the drafted token."""
    _, q, lg = make_case(seed, 6)
    lg = _logits_for(rule, lg)
    one_hot = np.eye(6)[2]
    for what in ("acceptance", "correction"):
        law = getattr(rule, what)
        _close(
            law(None, q, 2, logits=lg),
            law(one_hot, q, 2, logits=lg),
            f"{what} with draft_probs=None differs from one-hot",
            rtol=1e-15,
            atol=0,
            q=q,
        )


def check_bad_input(rule, seed):
    """Bad input raises a ValueError that names the argument."""
    _, _, lg = make_case(seed, 4)
    p, q = np.full(4, 0.25), np.array([0.1, 0.2, 0.3, 0.4])
    logits = _logits_for(rule, lg)
    cases = [
        ("draft_probs must sum to 1", lambda: rule.acceptance(p * 1.1, q, 0, logits=logits)),
        ("target_probs must be non-negative", lambda: rule.acceptance(p, q - 0.5, 0, logits=logits)),
        ("target_probs must be finite", lambda: rule.acceptance(p, np.full(4, np.nan), 0, logits=logits)),
        ("share one vocabulary", lambda: rule.acceptance(np.full(5, 0.2), q, 0, logits=logits)),
        ("drafted_token must lie in [0, 4)", lambda: rule.acceptance(p, q, 4, logits=logits)),
        ("logits must be a RuleLogits", lambda: rule.acceptance(p, q, 0, logits=lg.target)),
        ("draft_probs is None", lambda: rule.acceptance(None, q, None, logits=logits)),
        (
            "logits.target contains NaN",
            lambda: rule.acceptance(p, q, 0, logits=dataclasses.replace(lg, target=np.full(4, np.nan))),
        ),
        (
            "logits.target with shape (3,)",
            lambda: rule.acceptance(p, q, 0, logits=dataclasses.replace(lg, target=np.zeros(3))),
        ),
    ]
    if rule.needs_logits:
        cases.append(("logits from before temperature", lambda: rule.acceptance(p, q, 0)))
    for expected, call in cases:
        try:
            call()
        except ValueError as exc:
            if expected not in str(exc):
                raise _Failed(f"bad input raised {exc!r}, which does not say {expected!r}") from None
        else:
            raise _Failed(f"bad input was accepted (expected a ValueError saying {expected!r})")


def check_spec_round_trip(rule, seed):
    """``make_rule(rule.describe())`` rebuilds the rule (parameters round-trip through the spec)."""
    if type(rule).name is None:
        return "not registered (no name)"
    again = make_rule(rule.describe())
    _true(again == rule, f"make_rule({rule.describe()!r}) gives {again!r}, not {rule!r}")
    _true(hash(again) == hash(rule), "the rebuilt rule hashes differently")
    return None


def check_monte_carlo(rule, seed):
    """Sampling the rule (``simulate``) agrees with its exact laws: emitted tokens, the relaxed and
    the verifier bonus, the per-position acceptance (binomial) and the accepted length."""
    if judgement_of(rule).block:
        return "a block rule: block_monte_carlo samples whole blocks"
    p, q, lg = make_case(seed + 3, 6, batch=(8,))
    p2, q2, lg2 = make_case(seed + 4, 6, batch=(8,))
    odd = np.arange(8)[:, None] % 2 == 1  # mix in rows of another case so every rule has rejections
    p, q = np.where(odd, p, p2), np.where(odd, q, q2)
    lg = RuleLogits(
        target=np.where(odd, lg.target, lg2.target),
        draft=np.where(odd, lg.draft, lg2.draft),
        temperature=lg.temperature,
    )
    logits = _logits_for(rule, lg)
    m = 1 if judgement_of(rule).slot_dependent else 3
    rule0 = rule.at_slot(0)
    sim = simulate(rule0, p, q, m=m, n_runs=6000, seed=seed + 11, logits=logits, bonus_policy="relaxed")
    pi = emitted_distribution(rule0, p, q, logits=logits)
    level = 1e-4
    pv = _chi_square_p_value(sim.emitted_counts, pi)
    _true(pv > level, f"emitted tokens do not follow the exact emitted law (chi-square p = {pv:.2e})", p=p, q=q)
    pv = _chi_square_p_value(sim.bonus_counts, emitted_distribution(rule0.at_slot(m), p, q, logits=logits))
    _true(pv > level, f"relaxed bonus tokens do not follow the emitted law (chi-square p = {pv:.2e})", p=p, q=q)
    beta = step_metrics(rule0, p, q, logits=logits).acceptance
    al = expected_accepted_length(beta, m)
    diff = sim.accepted - al[sim.block_start]
    bound = 4.5 * diff.std() / np.sqrt(diff.size) + 1e-12
    _true(abs(diff.mean()) < bound, f"accepted lengths average {diff.mean():+.4f} off the exact AL", p=p, q=q)
    seen = sim.drafts > 200
    se = np.sqrt(beta[seen] * (1 - beta[seen]) / sim.drafts[seen]) + 1e-12
    _true(
        np.abs(sim.acceptance_rate[seen] - beta[seen]) < 5 * se + 1e-12,
        "per-position acceptance rates are not binomial around the exact acceptance",
        p=p,
        q=q,
    )
    sim_v = simulate(rule0, p, q, m=m, n_runs=3000, seed=seed + 12, logits=logits)
    pv = _chi_square_p_value(sim_v.bonus_counts, q)
    _true(pv > level, f"verifier bonus tokens do not follow q (chi-square p = {pv:.2e})", p=p, q=q)
    return None


def check_numpy_torch_agree(rule, seed):
    """On torch tensors (float64 and float32) the rule gives NumPy's values, keeping the dtype;
    float16 / bfloat16 inputs are accepted and give probabilities."""
    torch = _torch()
    if torch is None:
        return "torch is not installed"
    p, q, lg = make_case(seed + 5, 10, batch=(4,))
    n = np.array([0, 3, 7, 9])
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        p_t, q_t = torch.as_tensor(p, dtype=dtype), torch.as_tensor(q, dtype=dtype)
        p_t, q_t = p_t / p_t.sum(-1, keepdim=True), q_t / q_t.sum(-1, keepdim=True)
        lg_t = RuleLogits(
            target=torch.as_tensor(lg.target, dtype=dtype),
            draft=torch.as_tensor(lg.draft, dtype=dtype),
            temperature=lg.temperature,
        )
        p64, q64 = p_t.double().numpy(), q_t.double().numpy()
        lg64 = RuleLogits(
            target=lg_t.target.double().numpy(), draft=lg_t.draft.double().numpy(), temperature=lg.temperature
        )
        for token in range(10):  # every token as the drafted one: where p > q as well as where p <= q
            every = np.full(4, token)
            _close(
                rule.acceptance(p_t, q_t, torch.as_tensor(every), logits=lg_t).double().numpy(),
                rule.acceptance(p64, q64, every, logits=lg64),
                f"torch {dtype} acceptance differs from NumPy's",
                rtol=tol,
                atol=tol,
                p=p,
                q=q,
                n=every,
            )
        a_t = rule.acceptance(p_t, q_t, torch.as_tensor(n), logits=lg_t)
        r_t = rule.correction(p_t, q_t, torch.as_tensor(n), logits=lg_t)
        _true(
            isinstance(a_t, torch.Tensor) and a_t.dtype == dtype and r_t.dtype == dtype,
            f"torch {dtype} in, {type(a_t).__name__} {getattr(a_t, 'dtype', '')} out",
            p=p,
            q=q,
        )
        p64, q64 = p_t.double().numpy(), q_t.double().numpy()
        lg64 = RuleLogits(
            target=lg_t.target.double().numpy(), draft=lg_t.draft.double().numpy(), temperature=lg.temperature
        )
        _close(
            a_t.double().numpy(),
            rule.acceptance(p64, q64, n, logits=lg64),
            f"torch {dtype} acceptance differs from NumPy's",
            rtol=tol,
            atol=tol,
            p=p,
            q=q,
            n=n,
        )
        r64 = rule.correction(p64, q64, n, logits=lg64)
        if dtype == torch.float64:
            _close(
                r_t.double().numpy(),
                r64,
                f"torch {dtype} correction differs from NumPy's",
                rtol=tol,
                atol=tol,
                p=p,
                q=q,
                n=n,
            )
        else:  # float32: the correction as it enters the emitted law, p(n) (1 - a) r, since where a draft is
            # rare or almost always accepted the residual norm((h - p)+) is a ratio of tiny differences
            a64 = np.asarray(rule.acceptance(p64, q64, n, logits=lg64))[..., None]
            pn = np.take_along_axis(p64, n[:, None], -1)
            _close(
                pn * (1 - a_t.double().numpy())[..., None] * r_t.double().numpy(),
                pn * (1 - a64) * r64,
                f"torch {dtype} correction differs from NumPy's (weighted by p(n) (1 - a))",
                rtol=tol,
                atol=tol,
                p=p,
                q=q,
                n=n,
            )
        pi_t = emitted_distribution(rule, p_t, q_t, logits=lg_t)
        _true(
            isinstance(pi_t, torch.Tensor) and pi_t.dtype == torch.float64,
            "the emitted law of torch input is not a float64 tensor",
            p=p,
            q=q,
        )
    for dtype in (torch.float16, torch.bfloat16):
        p_t, q_t = torch.as_tensor(p).to(dtype), torch.as_tensor(q).to(dtype)
        lg_t = RuleLogits(
            target=torch.as_tensor(lg.target).to(dtype),
            draft=torch.as_tensor(lg.draft).to(dtype),
            temperature=lg.temperature,
        )
        idx = torch.as_tensor(n)
        a, r = rule.acceptance(p_t, q_t, idx, logits=lg_t), rule.correction(p_t, q_t, idx, logits=lg_t)
        _true(a.dtype == dtype and r.dtype == dtype, f"{dtype} in, {a.dtype} out", p=p, q=q)
        _true(bool(torch.all((a >= 0) & (a <= 1)) and torch.all(r >= 0)), f"{dtype}: not probabilities", p=p, q=q)
        pi = emitted_distribution(rule, p_t, q_t, logits=lg_t)
        _close(pi.sum(-1).numpy(), 1.0, f"{dtype}: the emitted law does not sum to 1", rtol=1e-9, atol=0, p=p, q=q)
    return None


#: The checks by name, in the order ``check_rule`` runs them.
CHECKS = {
    "probabilities": check_probabilities,
    "bonus_laws": check_bonus_laws,
    "acceptance_all": check_acceptance_all,
    "emitted_matches_bruteforce": check_emitted_matches_bruteforce,
    "lossless": check_lossless,
    "drafter_without_probabilities": check_drafter_without_probabilities,
    "bad_input": check_bad_input,
    "spec_round_trip": check_spec_round_trip,
    "monte_carlo": check_monte_carlo,
    "numpy_torch_agree": check_numpy_torch_agree,
    "block_lossless": check_block_lossless,
    "block_at_least_token": check_block_at_least_token,
    "block_monte_carlo": check_block_monte_carlo,
    "block_survival": check_block_survival,
    "multi_verify": check_multi_verify,
    "multi_enumeration": check_multi_enumeration,
    "multi_below_optimum": check_multi_below_optimum,
    "multi_single_draft": check_multi_single_draft,
}
#: Checks over random inputs, run on ``cases`` seeds; the others run once.
_PER_CASE = (
    "numpy_torch_agree",
    "probabilities",
    "bonus_laws",
    "acceptance_all",
    "emitted_matches_bruteforce",
    "lossless",
    "multi_verify",
    "multi_enumeration",
    "multi_below_optimum",
    "multi_single_draft",
)
#: Checks of the per-token protocol: a multi-draft rule runs them on its one-draft form
#: (``single()``), whose acceptance and correction its per-token methods are.
_PER_TOKEN = ("probabilities", "acceptance_all", "emitted_matches_bruteforce", "numpy_torch_agree")


def check_rule(rule, *, checks=None, seed=0, cases=10) -> dict:
    """Run the conformance checks on ``rule`` (a Rule or a spec string); return {check: "passed"
    or "skipped: reason"}.

    The checks (``CHECKS``): acceptance in [0, 1] and corrections that are distributions; the
    bonus laws; ``acceptance_all`` against ``acceptance``; the emitted law against an O(V^2)
    brute force (so a wrong ``emitted`` override is caught); lossless rules emit q; a drafter
    without probabilities is one-hot; bad input is refused naming the argument; parameters
    round-trip through the spec string; Monte Carlo agrees with the exact laws; NumPy agrees
    with torch (skipped without torch); a lossless rule emits the verifier's sequence law block
    after block (enumerated); a block rule accepts at least what SpS does and sampling it gives
    its exact accepted length; a multi-draft rule's ``verify`` gives laws, its fast forms equal
    the enumeration over every drafted tuple, a lossless one stays below the maximal coupling of
    its drafts and q, and at k = 1 it is its one-draft form (its per-token checks run on that
    form, ``single()``). ``checks`` runs a subset by name; the input-driven checks run on
    ``cases`` random inputs from ``seed``.

    Raises
    ------
    AssertionError
        Naming the check, the rule and the input that broke it.
    ValueError
        For an unknown check name.
    """
    rule = make_rule(rule)
    names = list(CHECKS) if checks is None else [checks] if isinstance(checks, str) else list(checks)
    unknown = [c for c in names if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; the checks are {', '.join(CHECKS)}")
    if not names:
        raise ValueError("checks is empty: name at least one check (None runs them all)")
    check_int(cases, "cases", 1, what="random inputs per input-driven check")
    check_int(seed, "seed", 0)
    label = rule.describe() if hasattr(rule, "describe") else repr(rule)
    report = {}
    for name in names:
        seeds = [seed + 7919 * i for i in range(cases)] if name in _PER_CASE else [seed]
        skipped = None
        subject = rule.single() if _multi(rule) and name in _PER_TOKEN else rule
        for s in seeds:
            try:
                check_sane(rule, s)  # no check passes a rule whose numbers are not probabilities
                skipped = CHECKS[name](subject, s)
            except _Failed as exc:
                raise AssertionError(f"check_rule({label!r}): {name} failed (seed {s}): {exc}") from None
            except Exception as exc:
                raise AssertionError(
                    f"check_rule({label!r}): {name} raised {type(exc).__name__}: {exc} (seed {s})"
                ) from exc
        report[name] = f"skipped: {skipped}" if skipped else "passed"
    return report


def conformance_rules(builtin_only: bool = False) -> list:
    """Every registered rule at its defaults and at each setting its class lists in ``examples``
    (aliases at their fixed parameters), each once: what the conformance suite checks."""
    rules = {}
    for info in available_rules().values():
        if builtin_only and not info.builtin:
            continue
        settings = [{}] + [
            {k: v for k, v in ex.items() if k not in info.fixed}
            for ex in info.rule_class.examples
            if all(ex.get(k, v) == v for k, v in info.fixed.items())
        ]
        for params in settings:
            rule = info.rule_class(**{**info.fixed, **params})
            rules.setdefault(rule.describe(), rule)
    return list(rules.values())


def same_rules(rules, *, seeds=range(20), vocab=12) -> list:
    """Pairs of rules (spec strings) of different classes that are one rule: the same acceptance
    for every drafted token (over the drafts, for multi-draft rules) and the same emitted law on
    random inputs, and neither declares the
    other in ``same_law_as``. A rule written again under a new name shows up here (Medusa's
    typical acceptance added as a new rule when ``tas`` exists)."""
    import itertools

    cases = [make_case(s, vocab, batch=(4,)) for s in seeds]
    rules = [make_rule(r) for r in rules]

    def law(rule):
        out = []
        for p, q, lg in cases:
            logits = _logits_for(rule, lg)
            accept = rule.multi_acceptance(p, q) if _multi(rule) else rule.acceptance_all(p, q, logits=logits)
            out.append((accept, emitted_distribution(rule, p, q, logits=logits)))
        return out

    laws = [law(r) for r in rules]
    pairs = []
    for (ra, la), (rb, lb) in itertools.combinations(zip(rules, laws, strict=True), 2):
        if type(ra) is type(rb):
            continue  # one class at two settings: its parameters, not a second rule
        declared = rb.family in getattr(type(ra), "same_law_as", ()) or ra.family in getattr(
            type(rb), "same_law_as", ()
        )
        equal = all(
            np.shape(x[0]) == np.shape(y[0])
            and np.allclose(x[0], y[0], atol=1e-12)
            and np.allclose(x[1], y[1], atol=1e-12)
            for x, y in zip(la, lb, strict=True)
        )
        if equal and not declared:
            pairs.append((ra.describe(), rb.describe()))
    return pairs
