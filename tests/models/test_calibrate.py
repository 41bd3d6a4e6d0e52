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


def test_the_loop_s_own_cost_is_in_the_cost_model_and_the_baseline():
    """Whole steps timed as the decoder runs them: the step overhead is the median over m of what a step
    took beyond its timed parts (never below the cropping), the verifier alone's loop overhead what a token
    took beyond verify(1); recomputed here from the recorded timings, and the planner's baseline token is
    verify(1) plus it."""
    import numpy as np

    from cactus_theory._models._calibrate import LOOP_MS, calibrate_cost

    tok = tiny_tokenizer()
    identity = {"name": "tiny", "source": "test", "files": {}}

    def calibrate(**options):
        pair = ((tiny_model(0), tok, identity), (tiny_model(1, layers=1), tok, identity))
        return calibrate_cost(*pair, context=8, progress=False, prompt_lengths=(4,), **options)

    cost = calibrate(max_block=5, repeats=3)
    loop = cost.source["loop"]
    assert sorted(int(m) for m in loop["steps"]) == [m for m in LOOP_MS if m < 5] == [1, 2, 4]
    residuals = [t - (int(m) * cost.draft_token + cost.verify_block[int(m) + 1]) for m, t in loop["steps"].items()]
    assert cost.step_overhead == max(loop["crop_overhead"], float(np.median(residuals))) > 0
    assert cost.alone_overhead == max(0.0, loop["alone"] - cost.verify_block[1])
    assert all(t > 0 for t in [loop["alone"], *loop["steps"].values()])
    assert cost.alone_token() == cost.verify(1) + cost.alone_overhead
    step = cost.step_time(2, 1.5)
    assert cost.speedup(2, 1.5) == pytest.approx(2.5 * (cost.verify(1) + cost.alone_overhead) / step, rel=1e-12)
    without = calibrate(max_block=3, repeats=1, loop=False)
    assert "loop" not in without.source and without.alone_overhead == 0.0
