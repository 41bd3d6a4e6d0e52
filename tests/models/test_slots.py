"""Several sequences in one Hugging Face forward (``_models._slots.SlotModel``): each slot's logits are a
fresh forward pass's over its own tokens, whatever slots share the forward, cropped or grown; a row's
float32 bits depend on the forward's shapes and its place, not on the other rows' tokens."""

import numpy as np
import pytest
from optional import torch
from tiny_models import tiny_model

pytestmark = pytest.mark.models


def fresh(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(tokens)])).logits[0].float()


def test_each_slot_sees_only_its_own_tokens_through_ragged_feeds_crops_and_growth():
    from cactus_theory._models._slots import SlotModel

    model = tiny_model(0)
    slots = SlotModel(model, 3, context=8)
    a, b, c = slots.sequence(), slots.sequence(), slots.sequence()
    seen = {a: [2, 3, 4, 5], b: [7, 8], c: [9]}
    out = slots.evaluate([(a, seen[a], "last"), (b, seen[b], "all"), (c, seen[c], "all")])
    np.testing.assert_allclose(out[0], fresh(model, seen[a])[-1:], atol=2e-5)
    np.testing.assert_allclose(out[1], fresh(model, seen[b]), atol=2e-5)
    np.testing.assert_allclose(out[2], fresh(model, seen[c]), atol=2e-5)
    out = slots.evaluate([(a, [10, 11, 12], "all"), (b, torch.tensor([13]), "last")])  # ragged: 3 and 1 tokens
    seen[a] += [10, 11, 12]
    seen[b] += [13]
    np.testing.assert_allclose(out[0], fresh(model, seen[a])[-3:], atol=2e-5)
    np.testing.assert_allclose(out[1], fresh(model, seen[b])[-1:], atol=2e-5)
    a.crop(5)  # a rejected tail: the slot forgets it
    seen[a] = seen[a][:5]
    out = slots.evaluate([(a, list(range(20, 30)), "all")])  # 15 tokens: the cache grows past 8
    seen[a] += list(range(20, 30))
    assert slots.capacity >= 15 and a.length == 15
    np.testing.assert_allclose(out[0], fresh(model, seen[a])[-10:], atol=2e-5)
    assert model.config._attn_implementation == "sdpa"  # the model's own setting, restored


def test_a_rows_bits_depend_on_the_shapes_not_on_the_other_rows():
    """Every slot in each step, attending over the whole fixed span: slot 1's logits are the same bits
    whatever the other slots hold (what lets a resumed dump equal a run straight through)."""
    from cactus_theory._models._hf import torch_threads
    from cactus_theory._models._slots import SlotModel

    model = tiny_model(0)
    got = []
    with torch_threads(1):
        for others in ([3, 4, 5], [40, 41, 42]):
            slots = SlotModel(model, 3, context=16, fixed_span=True)
            seqs = [slots.sequence() for _ in range(3)]
            ids = torch.tensor([[0, others[0], others[1]], [2, 3, 4], [others[2], 6, 7]])
            slots.forward_rows([0, 1, 2], ids, [2, 3, 3], "last", all_slots=True)
            step = torch.tensor([[others[1]], [9], [others[0]]])
            got.append(slots.forward_rows([0, 1, 2], step, [1, 1, 1], "last", all_slots=True)[1])
            assert [q.length for q in seqs] == [3, 4, 4]
    assert torch.equal(got[0], got[1])


def test_models_the_slots_cannot_run_are_refused_by_name():
    from cactus_theory._models._slots import SlotModel

    model = tiny_model(0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        SlotModel(model, 2)
    model = tiny_model(0)
    model.config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError, match="sliding window"):
        SlotModel(model, 2)
    slots = SlotModel(tiny_model(0), 1)
    held = slots.sequence()
    with pytest.raises(ValueError, match="all 1 sequences"):
        slots.sequence()
    with pytest.raises(ValueError, match="sequences must be an integer >= 1"):
        SlotModel(tiny_model(0), 0)
    held.close()
    assert slots.sequence().slot == 0  # a closed slot is free again
