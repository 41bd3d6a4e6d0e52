"""The calibration times every shape warmed up: a model whose first forward of each new shape stalls (as a
GPU choosing kernels does) leaves no stalled sample in the cost file; the device is synchronised around
each timing (a no-op on the CPU)."""

import functools
import time

import pytest
from tiny_models import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.models

STALL = 1.0  # seconds the first forward of a shape takes; nothing else here comes near it


def stalling(model):
    """``model`` whose first forward of each input shape sleeps ``STALL`` seconds first."""
    seen, base = set(), type(model)

    @functools.wraps(base.forward)
    def forward(self, *args, **kwargs):
        shape = tuple(kwargs["input_ids"].shape) if "input_ids" in kwargs else tuple(args[0].shape)
        if shape not in seen:
            seen.add(shape)
            time.sleep(STALL)
        return base.forward(self, *args, **kwargs)

    model.__class__ = type("Stalling" + base.__name__, (base,), {"forward": forward})
    return model, seen


def test_no_sample_of_a_shapes_first_call_is_kept():
    from cactus_theory._models._calibrate import _synchronizer, calibrate_cost

    (verifier, shapes), (draft, _) = stalling(tiny_model(0)), stalling(tiny_model(1, layers=1))
    tok = tiny_tokenizer()
    identity = {"name": "tiny", "source": "test", "files": {}}
    cost = calibrate_cost(
        (verifier, tok, identity),
        (draft, tok, identity),
        max_block=4,
        context=8,
        repeats=2,
        progress=False,
        prompt_lengths=(4, 6),
        batch=(1, 2),
    )
    samples = cost.samples
    timed = [*samples["draft_token"], *[t for v in samples["verify_block"].values() for t in v]]
    timed += [t for per in samples["prefill"].values() for v in per.values() for t in v]
    timed += [t for entry in cost.batch.values() for v in entry["samples"]["verify_block"].values() for t in v]
    assert len(shapes) >= 6 and len(timed) == 2 + 4 * 2 + 2 * 2 * 2 + 4 * 2
    assert max(timed) < STALL  # every stalled first call was a warm-up, none a sample
    assert cost.source["decoder"] == "device" and cost.judge_token == 0.0
    assert _synchronizer(verifier)() is None


def test_a_tokenizer_that_encodes_the_text_to_nothing_is_named():
    from cactus_theory._models._calibrate import calibrate_cost

    def silent(text, add_special_tokens=False):
        return {"input_ids": []}

    identity = {"name": "tiny", "source": "test", "files": {}}
    with pytest.raises(ValueError, match="the tokenizer encodes the calibration's text to no tokens"):
        calibrate_cost(
            (tiny_model(0), silent, identity),
            (tiny_model(1, layers=1), silent, identity),
            max_block=2,
            context=8,
            repeats=1,
            progress=False,
            prompt_lengths=(4,),
        )
