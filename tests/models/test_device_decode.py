"""Decoding on the device (``_models._device_loop``, through ``speculative_batch_steps``): lossless where
the rule is, the same tokens at any batch size, greedy SpS equal to the greedy verifier, the verifier alone
equal to the dump, and the host path (options the device path leaves to it) equal to one prompt at a time."""

import numpy as np
import pytest
from optional import torch
from scipy import stats
from tiny_models import tiny_model, tiny_tokenizer

from cactus_theory import Cactus, SamplingSettings, SpS
from cactus_theory._data._prompts import Prompt, prompt_seed
from cactus_theory._math._sampling import processed_probs
from cactus_theory._models._decoding import (
    autoregressive_generate_batch,
    speculative_generate,
    speculative_generate_batch,
)
from cactus_theory.traces import Trace, dump_trace

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


# --- the static path: a preallocated cache, every slot in every forward, graphs replayed ---------------------


def _static_run(verifier, draft, rule, m, **flags):
    from cactus_theory._models._clock import drain
    from cactus_theory._models._decode_spec import DecodeSpec
    from cactus_theory._models._decoding import batched_decoder

    settings = SamplingSettings(temperature=1.0, top_k=20, top_p=0.9)
    spec = DecodeSpec(rule=rule, m=m, settings=settings, max_new_tokens=14, **flags)
    decoder = batched_decoder(spec, verifier, draft if rule is not None else None)
    return drain(decoder.steps(PROMPTS, SEEDS, {1, 7}))


@pytest.fixture(scope="module")
def double_models():
    """The pair in float64: the static path's other shapes round differently, by about 1e-16 here."""
    return tiny_model(10).double(), tiny_model(11, layers=1).double()


@pytest.mark.parametrize("rule", [None, SpS(), Cactus(1.0)])
def test_the_static_cache_and_its_graphs_emit_the_eager_path_s_tokens(double_models, rule, monkeypatch):
    """A fixed span and every slot in every forward (requests ending at different steps: the ended ones ride
    as padding) give the dynamic path's tokens; graphs (the CPU stand-in, which replays the forward on the
    graph's own input buffers) give the static path's bit for bit, so every input reaches those buffers."""
    from cactus_theory._models import _device_loop as _device_decode

    verifier, draft = double_models
    eager = _static_run(verifier, draft, rule, 3)
    static = _static_run(verifier, draft, rule, 3, static_cache=True)
    assert [r.tokens for r in static] == [r.tokens for r in eager]
    assert [r.accepted for r in static] == [r.accepted for r in eager]
    assert len({len(r.tokens) for r in eager}) > 1  # requests ended at different steps
    monkeypatch.setattr(_device_decode, "_graph_kind", lambda device: "emulate")
    graphed = _static_run(verifier, draft, rule, 3, cuda_graphs=True)
    assert [r.tokens for r in graphed] == [r.tokens for r in static]
    assert [r.accepted for r in graphed] == [r.accepted for r in static]


def test_graphs_replay_their_own_buffers_with_each_step_s_inputs(double_models):
    """The stand-in's replays against eager forwards of the same fixed-span shapes, step by step: equal bit
    for bit, with other tokens and positions each step (a forward that kept its first inputs would not be)."""
    from cactus_theory._models._slots import SlotModel

    verifier = double_models[0]
    outs = []
    for graphs in (None, "emulate"):
        slots = SlotModel(verifier, 2, context=32, fixed_span=True, graphs=graphs)
        seqs = [slots.sequence(), slots.sequence()]
        slots.forward_rows([0, 1], torch.tensor([[5, 9, 14], [0, 2, 3]]), [3, 2], "last", all_slots=True)
        rows = []
        for step in range(4):
            ids = torch.tensor([[20 + step], [30 + 2 * step]])
            rows.append(slots.forward_rows([0, 1], ids, [1, 1], "last", all_slots=True).clone())
        assert [s.length for s in seqs] == [7, 6]
        outs.append(torch.stack(rows))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0][0], outs[0][1])


def test_static_options_refused_where_they_cannot_run(double_models):
    verifier, draft = double_models
    with pytest.raises(ValueError, match="cuda_graphs captures CUDA graphs: the models are on cpu"):
        _static_run(verifier, draft, SpS(), 2, cuda_graphs=True)
    with pytest.raises(ValueError, match="static_cache / cuda_graphs / fuse_rule: the static cache, CUDA graphs and"):
        _static_run(verifier, draft, SpS(), 2, static_cache=True, drift=True)
    from cactus_theory._models._slots import SlotModel

    with pytest.raises(ValueError, match="graphs need fixed_span=True"):
        SlotModel(verifier, 2, graphs="emulate")
    with pytest.raises(ValueError, match="graphs='cuda' captures CUDA graphs: the model is on cpu"):
        SlotModel(verifier, 2, fixed_span=True, graphs="cuda")
