"""Decoding on the device (``_models._device_decode``, through ``speculative_batch_steps``): lossless where
the rule is, the same tokens at any batch size, greedy SpS equal to the greedy verifier, the verifier alone
equal to the dump, and the host path (options the device path leaves to it) equal to one prompt at a time."""

import numpy as np
import pytest
from optional import torch
from scipy import stats
from tiny_models import tiny_model, tiny_tokenizer

from cactus_theory import Cactus, SamplingSettings, SpS, Trace, dump_trace
from cactus_theory._data._prompts import Prompt, prompt_seed
from cactus_theory._math._sampling import processed_probs
from cactus_theory._models._decode import (
    autoregressive_generate_batch,
    speculative_generate,
    speculative_generate_batch,
)

pytestmark = pytest.mark.models

PROMPTS = [[5, 9, 14, 3, 27], [2, 3], [40, 41, 42, 43], [7], [11, 12, 13]]
SEEDS = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def models():
    return tiny_model(10), tiny_model(11, layers=1)


@pytest.mark.parametrize("rule", [SpS(), Cactus(1.0), Cactus(0.4, bonus="exact")])
@pytest.mark.parametrize("m", [1, 3])
def test_a_batch_decodes_each_prompt_as_it_would_alone(models, rule, m):
    verifier, draft = models
    settings = SamplingSettings(temperature=1.0, top_k=20, top_p=0.9)
    batch = speculative_generate_batch(verifier, draft, rule, m, PROMPTS, SEEDS, settings, 12, {1})
    for ids, seed, got in zip(PROMPTS, SEEDS, batch, strict=True):
        alone = speculative_generate_batch(verifier, draft, rule, m, [ids], [seed], settings, 12, {1})[0]
        assert got.tokens == alone.tokens and got.accepted == alone.accepted and got.drafted == alone.drafted
        assert all(a <= d <= m for a, d in zip(got.accepted, got.drafted, strict=True))


def test_sps_on_the_device_emits_the_verifiers_distribution(models):
    """The first token of 3,000 requests (one batch, each its own seed) against q after the prompt:
    chi-square, cells below 5 expected pooled."""
    verifier, draft = models
    settings = SamplingSettings(temperature=1.0, top_k=6, top_p=1.0)
    runs = 3000
    out = speculative_generate_batch(verifier, draft, SpS(), 2, [PROMPTS[0]] * runs, list(range(runs)), settings, 1)
    with torch.no_grad():
        q = processed_probs(verifier(input_ids=torch.tensor([PROMPTS[0]])).logits[0, -1].double(), settings).numpy()
    counts = np.bincount([r.tokens[0] for r in out], minlength=q.size)
    assert counts[q == 0].sum() == 0  # never a token the verifier excludes
    expected = q[q > 0] * runs
    big = expected >= 5
    obs = np.append(counts[q > 0][big], counts[q > 0][~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    assert stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue > 1e-3


@pytest.mark.parametrize("m", [1, 4])
def test_greedy_sps_on_the_device_equals_the_greedy_verifier(models, m):
    verifier, draft = models
    greedy = SamplingSettings(temperature=0.0, top_k=0, top_p=1.0)
    alone = autoregressive_generate_batch(verifier, PROMPTS, SEEDS, greedy, 15, {1})
    spec = speculative_generate_batch(verifier, draft, SpS(), m, PROMPTS, SEEDS, greedy, 15, {1}, draft_mode="greedy")
    assert [s.tokens for s in spec] == [a.tokens for a in alone]


def test_the_verifier_alone_emits_the_tokens_a_dump_holds(tmp_path, models):
    verifier, draft = models
    tok = tiny_tokenizer()
    settings = SamplingSettings(temperature=1.0, top_k=20, top_p=0.9)
    prompts = [Prompt(id=f"q{i}", task="toy", text=f"t{3 + i} t{9 + i} t{20 + i}", index=i) for i in range(4)]
    dump_trace(
        (verifier, tok),
        (draft, tok),
        prompts,
        tmp_path / "t",
        settings=settings,
        max_new_tokens=9,
        seed=2,
        progress=False,
        batch=2,
    )
    held = {s.id: s.tokens.tolist() for s in Trace(tmp_path / "t")}
    ids = [tok(p.text)["input_ids"] for p in prompts]
    alone = autoregressive_generate_batch(verifier, ids, [prompt_seed(2, p.id) for p in prompts], settings, 9, {1})
    assert [a.tokens for a in alone] == [held[p.id] for p in prompts]


def test_the_host_path_on_slots_equals_one_prompt_at_a_time(models):
    """A relaxed bonus is judged on the host (not on the device path): a batch of Hugging Face slots gives
    each prompt the tokens ``speculative_generate`` gives it with the same seed."""
    verifier, draft = models
    settings = SamplingSettings(temperature=1.0, top_k=20, top_p=0.9)
    batch = speculative_generate_batch(
        verifier, draft, Cactus(1.0), 3, PROMPTS, SEEDS, settings, 10, {1}, bonus_policy="relaxed"
    )
    for ids, seed, got in zip(PROMPTS, SEEDS, batch, strict=True):
        one = speculative_generate(
            verifier, draft, Cactus(1.0), 3, settings, 10, seed, ids, {1}, bonus_policy="relaxed"
        )
        assert got.tokens == one.tokens
