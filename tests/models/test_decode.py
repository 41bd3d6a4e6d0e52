"""Real speculative decoding with tiny random models: correctness against the verifier."""

import itertools

import numpy as np
import pytest
from locations import FIXTURES, ROOT
from optional import torch
from scipy import stats
from tiny_models import tiny_model

from cactus_theory import Cactus, SpS, emitted_distribution
from cactus_theory._math._sampling import SamplingSettings, processed_probs
from cactus_theory._models._decoding import NgramDrafter, autoregressive_generate, speculative_generate
from cactus_theory._models._hf import CachedModel
from cactus_theory.rules import SCD, TAS, Lossy, RuleLogits, SyntheticAcceptance

pytestmark = pytest.mark.models  # every test here runs tiny Hugging Face models

PROMPT = [5, 9, 14, 3, 27]


@pytest.fixture(scope="module")
def models():
    return tiny_model(10), tiny_model(11, layers=1)


def _exact_two_token_law(verifier, settings):
    """P(t1, t2) = q(t1 | prompt) q(t2 | prompt, t1), by brute force over the supports."""
    with torch.no_grad():
        q1 = processed_probs(verifier(input_ids=torch.tensor([PROMPT])).logits[0, -1].double(), settings)
        law = {}
        for t1 in torch.nonzero(q1).flatten().tolist():
            logits = verifier(input_ids=torch.tensor([[*PROMPT, t1]])).logits[0, -1].double()
            q2 = processed_probs(logits, settings)
            for t2 in torch.nonzero(q2).flatten().tolist():
                law[(t1, t2)] = float(q1[t1] * q2[t2])
    return law


def _decode_two_tokens(verifier, draft, rule, settings, law, runs=400, **kwargs):
    """Counts of the first two emitted tokens over ``runs`` seeds; every one must have probability > 0."""
    counts = dict.fromkeys(law, 0)
    for seed in range(runs):
        out = speculative_generate(
            verifier, draft, rule, sampling=settings, max_new_tokens=2, seed=seed, prompt_ids=PROMPT, **kwargs
        )
        key = tuple(out.tokens[:2])
        assert key in law, f"emitted {key}, which has probability 0"
        counts[key] += 1
    return counts


def _chi_square_p_value(law, counts):
    """Chi-square goodness of fit of counts to an exact law (cells expected below 5 pooled)."""
    keys = sorted(law)
    expected = np.array([law[k] for k in keys]) * sum(counts.values())
    observed = np.array([counts[k] for k in keys])
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


def test_sps_emits_the_verifier_distribution(models):
    verifier, draft = models
    settings = SamplingSettings(temperature=1.0, top_k=4, top_p=1.0)
    law = _exact_two_token_law(verifier, settings)
    counts = _decode_two_tokens(verifier, draft, SpS(), settings, law, m=2)
    assert _chi_square_p_value(law, counts) > 1e-3


@pytest.mark.parametrize("m", [1, 3, 5])
def test_greedy_sps_equals_greedy_verifier(models, m):
    verifier, draft = models
    greedy = SamplingSettings(temperature=0.0, top_k=0, top_p=1.0)
    alone = autoregressive_generate(verifier, PROMPT, greedy, max_new_tokens=20)
    spec = speculative_generate(verifier, draft, SpS(), m=m, sampling=greedy, max_new_tokens=20, prompt_ids=PROMPT)
    assert spec.tokens == alone.tokens
    ngram = speculative_generate(
        verifier, NgramDrafter(), SpS(), m=m, sampling=greedy, max_new_tokens=20, prompt_ids=PROMPT
    )
    assert ngram.tokens == alone.tokens
    assert sum(spec.accepted) + len(spec.accepted) >= len(spec.tokens) - 1


def test_cropped_cache_matches_a_fresh_forward_pass(models):
    verifier, _ = models
    runner = CachedModel(verifier)
    runner.feed([*PROMPT, 7, 8, 9, 10])
    runner.crop(len(PROMPT) + 1)  # drop 8, 9, 10
    cached = runner.feed([11, 12])
    with torch.no_grad():
        fresh = verifier(input_ids=torch.tensor([[*PROMPT, 7, 11, 12]])).logits[0, -2:].float()
    np.testing.assert_allclose(cached.numpy(), fresh.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rule", [Cactus(1.0), TAS()])
def test_relaxed_rules_run_and_count(models, rule):
    verifier, draft = models
    out = speculative_generate(
        verifier, draft, rule, m=4, sampling=SamplingSettings(), max_new_tokens=16, seed=3, prompt_ids=PROMPT
    )
    assert len(out.tokens) == 16
    assert all(0 <= a <= d for a, d in zip(out.accepted, out.drafted, strict=True))
    assert out.mean_acceptance_length == 1 + out.accepted_length


def _emitted_two_token_law(verifier, draft, rule, settings):
    """P(t1, t2) = pi(t1 | prompt) pi(t2 | prompt, t1) with pi the rule's exact emitted law: the law
    of two tokens with m = 1 under the relaxed bonus policy (the bonus passes the rule too)."""

    def pi(ids):
        with torch.no_grad():
            zq = verifier(input_ids=torch.tensor([ids])).logits[0, -1].double()
            zp = draft(input_ids=torch.tensor([ids])).logits[0, -1].double()
        p, q = processed_probs(zp, settings).numpy(), processed_probs(zq, settings).numpy()
        logits = RuleLogits(target=zq.numpy(), draft=zp.numpy(), temperature=settings.temperature)
        return emitted_distribution(rule, p, q, logits=logits)

    first = pi(PROMPT)
    law = {}
    for t1 in np.flatnonzero(first > 0).tolist():
        second = pi([*PROMPT, t1])
        for t2 in np.flatnonzero(second > 0).tolist():
            law[(t1, t2)] = float(first[t1] * second[t2])
    return law


@pytest.mark.parametrize("rule", [Lossy(0.7), SCD(0.5)], ids=["lossy", "scd-needs-logits"])
def test_relaxed_bonus_emits_the_rule_law_at_the_bonus_position(models, rule):
    verifier, draft = models
    settings = SamplingSettings(temperature=1.0, top_k=4, top_p=1.0)
    law = _emitted_two_token_law(verifier, draft, rule, settings)
    counts = _decode_two_tokens(verifier, draft, rule, settings, law, m=1, bonus_policy="relaxed")
    assert _chi_square_p_value(law, counts) > 1e-3


def test_slot_dependent_rule_uses_its_rate_per_slot(models):
    verifier, draft = models
    rule = SyntheticAcceptance((1.0, 1.0, 0.0))  # slots 0 and 1 always accepted, slot 2 never
    out = speculative_generate(verifier, draft, rule, m=4, max_new_tokens=30, seed=0, prompt_ids=PROMPT)
    assert set(out.accepted[:-1]) == {2}


def test_ngram_drafter_proposes_what_followed():
    assert NgramDrafter().propose([1, 2, 3, 9, 9, 1, 2, 3], 3) == [9, 9, 1]
    assert NgramDrafter().propose([4, 5], 3) == []
    assert list(itertools.islice(NgramDrafter(max_ngram=1).propose([7, 1, 7], 2), 2)) == [1, 7]


def test_bad_arguments(models):
    verifier, draft = models
    message = r"^m must be an integer between 1 and 256 \(drafted tokens per verification\); got 0$"
    with pytest.raises(ValueError, match=message):
        speculative_generate(verifier, draft, SpS(), m=0, prompt_ids=PROMPT)
    with pytest.raises(ValueError, match="at least one token"):
        speculative_generate(verifier, draft, SpS(), m=2, prompt_ids=[])
    with pytest.raises(ValueError, match="needs a draft model with probabilities"):
        speculative_generate(verifier, NgramDrafter(), SpS(), m=2, prompt_ids=PROMPT, bonus_policy="relaxed")
    with pytest.raises(ValueError, match="bonus_policy must be one of"):
        speculative_generate(verifier, draft, SpS(), m=2, prompt_ids=PROMPT, bonus_policy="draft")


def _table_module():
    import importlib.util
    import sys

    if str(ROOT / "experiments") not in sys.path:  # a script imports its siblings (common.py), as run from there
        sys.path.insert(0, str(ROOT / "experiments"))
    path = ROOT / "experiments" / "real_decoding_table.py"
    spec = importlib.util.spec_from_file_location("real_decoding_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wilson_interval_closed_forms():
    table = _table_module()
    z2 = 1.959963984540054**2
    # k = 0: [0, z^2 / (n + z^2)]; k = n: [n / (n + z^2), 1]; symmetric about 1/2 when k = n / 2
    assert table.wilson_interval(0, 10) == pytest.approx((0.0, 100 * z2 / (10 + z2)), abs=1e-12)
    assert table.wilson_interval(30, 30) == pytest.approx((100 * 30 / (30 + z2), 100.0), abs=1e-12)
    lo, hi = table.wilson_interval(10, 20)
    # statsmodels' proportion_confint(10, 20, method="wilson") gives (0.29929, 0.70071)
    assert lo + hi == pytest.approx(100.0) and lo == pytest.approx(29.929, abs=1e-3)


@pytest.mark.isolation
def test_answer_extraction_and_humaneval_execution():
    import gzip
    import json

    table = _table_module()
    assert table.gsm8k_answer("so 3 + 4 = 7\n#### 1,234") == 1234
    assert table.gsm8k_answer("The answer is 18.") == 18
    assert table.gsm8k_answer("no digits") is None
    data = FIXTURES / "benchmarks" / "humaneval" / "HumanEval.jsonl.gz"
    with gzip.open(data, "rt") as fh:
        problem = json.loads(fh.readline())
    good = problem["prompt"] + problem["canonical_solution"]
    assert table.humaneval_passes(problem, table.extract_code(f"```python\n{good}```", problem["prompt"]))
    assert not table.humaneval_passes(problem, problem["prompt"] + "    return not True\n")


@pytest.mark.parametrize("draft_mode", ["sampled", "greedy"])
@pytest.mark.parametrize("spec", ["block", "strict"])
def test_block_and_strict_emit_the_verifier_distribution(models, spec, draft_mode):
    # lossless in real decoding: the first two tokens follow the verifier's law (a block of 2
    # drafts covers both), whether the drafter samples or drafts greedily
    from cactus_theory import make_rule

    verifier, draft = models
    settings = SamplingSettings(temperature=1.0, top_k=4, top_p=1.0)
    law = _exact_two_token_law(verifier, settings)
    counts = _decode_two_tokens(verifier, draft, make_rule(spec), settings, law, m=2, draft_mode=draft_mode)
    assert _chi_square_p_value(law, counts) > 1e-3


@pytest.mark.parametrize("m", [1, 4])
def test_greedy_block_equals_greedy_verifier(models, m):
    from cactus_theory import make_rule

    verifier, draft = models
    greedy = SamplingSettings(temperature=0.0, top_k=0, top_p=1.0)
    alone = autoregressive_generate(verifier, PROMPT, greedy, max_new_tokens=20)
    for drafter in (draft, NgramDrafter()):
        out = speculative_generate(
            verifier, drafter, make_rule("block"), m=m, sampling=greedy, max_new_tokens=20, prompt_ids=PROMPT
        )
        assert out.tokens == alone.tokens
        assert all(0 <= a <= d for a, d in zip(out.accepted, out.drafted, strict=True))


def test_a_block_rule_has_no_relaxed_bonus(models):
    from cactus_theory import make_rule

    verifier, draft = models
    with pytest.raises(ValueError, match="judges whole blocks"):
        speculative_generate(verifier, draft, make_rule("block"), m=2, prompt_ids=PROMPT, bonus_policy="relaxed")
    with pytest.raises(ValueError, match="draft_mode must be one of"):
        speculative_generate(verifier, draft, SpS(), m=2, prompt_ids=PROMPT, draft_mode="beam")


@pytest.mark.parametrize("spec", ["fly(window=1, threshold=0)", "magic-mtp", "hsd", "traversal"])
def test_real_decoding_runs_the_engine_block_rules(models, spec):
    # issue 33: real decoding accepts each new chain rule (through its block law)
    from cactus_theory import make_rule

    verifier, draft = models
    settings = SamplingSettings(temperature=1.0, top_k=4, top_p=1.0)
    total = 0
    for seed in range(5):
        out = speculative_generate(
            verifier, draft, make_rule(spec), m=3, sampling=settings, max_new_tokens=12, seed=seed, prompt_ids=PROMPT
        )
        assert len(out.tokens) >= 12 and all(0 <= a <= d <= 3 for a, d in zip(out.accepted, out.drafted, strict=True))
        total += sum(out.accepted)
    assert total > 0


@pytest.mark.parametrize("spec, draft_mode", [("sglang-chain", "sampled"), ("tli", "sampled"), ("strict", "greedy")])
def test_real_decoding_runs_the_engine_chain_rules(models, spec, draft_mode):
    # issue 33: SGLang's chain kernel and TLI (on a shared vocabulary) have SpS's law, and vLLM's
    # verification without draft probabilities (strict) is SpS on a greedy drafter's one-hot row:
    # the same tokens as SpS from the same seed
    from cactus_theory import make_rule

    verifier, draft = models
    settings = SamplingSettings(temperature=1.0, top_k=4, top_p=1.0)
    for seed in range(3):
        ours = speculative_generate(
            verifier,
            draft,
            make_rule(spec),
            m=3,
            sampling=settings,
            max_new_tokens=10,
            seed=seed,
            prompt_ids=PROMPT,
            draft_mode=draft_mode,
        )
        sps = speculative_generate(
            verifier,
            draft,
            SpS(),
            m=3,
            sampling=settings,
            max_new_tokens=10,
            seed=seed,
            prompt_ids=PROMPT,
            draft_mode=draft_mode,
        )
        assert ours.tokens == sps.tokens and ours.accepted == sps.accepted


def test_decoding_under_a_gate_is_the_rule_where_open_and_sps_where_closed(models):
    # issue 33: gated relaxation in real decoding; the same seed gives the same coins, so a gate
    # that never opens reproduces SpS token for token, and one always open the relaxed rule
    from cactus_theory._laws._gate import FunctionGate

    verifier, draft = models
    settings = SamplingSettings(temperature=1.0, top_k=6, top_p=1.0)
    relaxed = Lossy(alpha=0.7)
    runs = {}
    for name, rule, gate in (
        ("sps", SpS(), None),
        ("lossy", relaxed, None),
        ("shut", relaxed, FunctionGate(lambda prev: False, "shut")),
        ("open", relaxed, FunctionGate(lambda prev: True, "open")),
    ):
        runs[name] = [
            speculative_generate(
                verifier, draft, rule, m=3, sampling=settings, max_new_tokens=16, seed=s, prompt_ids=PROMPT, gate=gate
            ).tokens
            for s in range(6)
        ]
    assert runs["shut"] == runs["sps"] and runs["open"] == runs["lossy"] and runs["sps"] != runs["lossy"]
    with pytest.raises(ValueError, match="position by position"):
        speculative_generate(
            verifier, draft, "magic-mtp", m=3, sampling=settings, max_new_tokens=4, prompt_ids=PROMPT, gate="1:2"
        )


def test_drift_records_the_kl_of_the_law_each_token_was_emitted_from(models):
    # issue 33, item 6: per emitted token KL(pi_t || q_t); 0 for a lossless rule; the first token
    # (slot 0 after the prompt) has the exact law emitted_distribution(rule, p_1, q_1)
    verifier, draft = models
    settings = SamplingSettings(temperature=1.0, top_k=6, top_p=1.0)
    out = speculative_generate(
        verifier, draft, SpS(), m=3, sampling=settings, max_new_tokens=12, seed=0, prompt_ids=PROMPT, drift=True
    )
    assert len(out.token_kl) == len(out.tokens) and max(out.token_kl) < 1e-12 and out.answer_kl < 1e-11
    rule = Lossy(alpha=0.7)
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0)  # the tiny models' top-6 sets are disjoint
    with torch.no_grad():
        q1 = processed_probs(verifier(input_ids=torch.tensor([PROMPT])).logits[0, -1].double(), settings).numpy()
        p1 = processed_probs(draft(input_ids=torch.tensor([PROMPT])).logits[0, -1].double(), settings).numpy()
    pi = emitted_distribution(rule, p1, q1)
    want = float(np.sum(np.where(pi > 0, pi * np.log(np.where(pi > 0, pi, 1) / np.where(q1 > 0, q1, 1)), 0.0)))
    assert want > 0
    for seed in range(3):
        out = speculative_generate(
            verifier, draft, rule, m=3, sampling=settings, max_new_tokens=12, seed=seed, prompt_ids=PROMPT, drift=True
        )
        assert out.token_kl[0] == pytest.approx(want, rel=1e-6, abs=1e-9)
        assert len(out.token_kl) == len(out.tokens) and min(out.token_kl) >= 0
        assert out.answer_kl == pytest.approx(sum(out.token_kl))
    with pytest.raises(ValueError, match="whole blocks"):
        speculative_generate(
            verifier, draft, "block", m=3, sampling=settings, max_new_tokens=4, prompt_ids=PROMPT, drift=True
        )


def test_answer_drift_sums_each_answer_and_resamples_prompts():
    from cactus_theory.decode import answer_drift

    records = [
        {"id": f"p{i}", "task": "t" if i < 3 else "u", "rule": "lossy(alpha=0.7)", "token_kl": [0.1 * i] * (i + 1)}
        for i in range(5)
    ]
    rows = {r["task"]: r for r in answer_drift(records, n_boot=500)}
    sums = [0.1 * i * (i + 1) for i in range(5)]
    assert rows["all"]["answer_kl"] == pytest.approx(np.mean(sums))
    assert rows["all"]["kl_per_token"] == pytest.approx(sum(sums) / sum(i + 1 for i in range(5)))
    assert rows["all"]["answer_kl_lo"] <= rows["all"]["answer_kl"] <= rows["all"]["answer_kl_hi"]
    assert rows["t"]["prompts"] == 3 and rows["t"]["answer_kl"] == pytest.approx(np.mean(sums[:3]))
    with pytest.raises(ValueError, match="drift=True"):
        answer_drift([{"id": "a", "task": "t", "rule": "sps"}])
    # issue 43, item 14: a token KL of -1.0 gave an answer KL of -0.45, NaN gave nan
    for bad in (-1.0, float("nan"), float("inf")):
        broken = [*records, {"id": "p9", "task": "t", "rule": "lossy(alpha=0.7)", "token_kl": [0.1, bad]}]
        with pytest.raises(ValueError, match=r"'p9'.*not a list of KLs >= 0"):
            answer_drift(broken)
