"""Calibration: time a real model pair's forward passes on this machine and write a cost model
(``CostModel``) for the planner."""

from __future__ import annotations

import os
import platform
import time

import numpy as np

from .._analysis._cost import CostModel
from .._util._files import utc_timestamp
from .._util._machine import machine_sample, other_load

__all__ = ["calibrate_cost"]


def _timings(fn, repeats):
    """``repeats`` wall times of ``fn()``, seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def calibrate_cost(
    verifier,
    draft,
    *,
    max_block=21,
    context=256,
    repeats=5,
    settings=None,
    progress=None,
    prompt_lengths=(32, 128, 512),
    second_context=None,
    batch=(1,),
):
    """Time the parts of a step for a model pair on this machine: a CostModel.

    ``verifier`` and ``draft`` are (model, tokenizer, identity) triples from ``load_model``.
    Both models first read a context of ``context`` token ids (the tokenizer's encoding of a
    fixed English text, repeated) into their KV caches; then, each a median of ``repeats``:
    one drafted token (a forward of one token, its processed row with ``settings``, the
    sampling); a verifier block of k = 1..``max_block`` tokens (a forward and its k processed
    rows), the cache cropped back after each; the cropping itself; and SpS judging one drafted
    token on rows of the vocabulary's size (as ``speculative_generate`` does). Then the whole
    request's other parts: each model processing prompts of ``prompt_lengths`` tokens (a fresh
    cache each, ``min(repeats, 3)`` times), and one drafted token and one verifier token at
    ``second_context`` tokens of context (default 2 x ``context``), whose difference per token is
    the context slope. Every repeat is kept (``samples``: the intervals and the trust checks
    read them) with the machine's load average before and after. Deterministic inputs; the
    timings are whatever this machine gives (run it idle: ``CostModel.problems`` says when it
    was not).

    ``batch``: batch sizes B whose step parts are timed too (``CostModel.batch``; B >= 2 needs
    the llama.cpp engine: B sequences, each with the same context, in one evaluation): one draft
    forward of B sequences with its B rows processed and sampled, and the verifier scoring k
    tokens of each of the B sequences (k = 1..``max_block``) with the B k rows processed.
    """
    import torch

    from .._math._sampling import SamplingSettings, processed_probs
    from .._models._decode import _rule_step
    from .._models._hf import cached_model, dtype_and_device, engine_of, model_threads, sample_token, software_versions
    from .._rules import SpS
    from .._util._progress import progress_bar

    if not (isinstance(max_block, (int, np.integer)) and max_block >= 1):
        raise ValueError(f"max_block must be an integer >= 1; got {max_block!r}")
    if not (isinstance(repeats, (int, np.integer)) and repeats >= 1):
        raise ValueError(f"repeats must be an integer >= 1; got {repeats!r}")
    if not (isinstance(context, (int, np.integer)) and context >= 1):
        raise ValueError(f"context must be an integer >= 1; got {context!r}")
    lengths = sorted({int(n) for n in prompt_lengths})
    if any(n < 1 for n in lengths):
        raise ValueError(f"prompt_lengths must be integers >= 1; got {list(prompt_lengths)!r}")
    second_context = 2 * context if second_context is None else second_context
    sizes = sorted({int(b) for b in batch} - {1})
    if any(b < 1 for b in sizes) or any(isinstance(b, bool) for b in batch):
        raise ValueError(f"batch must list batch sizes >= 1; got {list(batch)!r}")
    if sizes and (engine_of(verifier[0]) != "llama.cpp" or engine_of(draft[0]) != "llama.cpp"):
        raise ValueError("timing batches of several sequences needs the llama.cpp engine (per-sequence caches): "
                         "calibrate with --engine llama.cpp, or leave --batch out")  # fmt: skip
    if not (isinstance(second_context, (int, np.integer)) and second_context > context):
        raise ValueError(f"second_context must be an integer > context ({context}); got {second_context!r}")
    sample_start = machine_sample()
    settings = settings or SamplingSettings()
    v_model, tokenizer, v_info = verifier
    d_model, _, d_info = draft
    text = (
        "Speculative decoding drafts several tokens with a small model and verifies them with a large one "
        "in a single forward pass; the acceptance rule decides how many of the drafted tokens to keep. "
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if tokenizer is not None else list(range(100))
    longest = max(context, second_context, *lengths)
    stream = ids * (longest // max(len(ids), 1) + 1)
    ids = stream[:context]
    ver, drf = cached_model(v_model), cached_model(d_model)
    ver.feed(ids, want="last")
    drf.feed(ids, want="last")
    gen = torch.Generator().manual_seed(0)
    token = ids[-1]

    def draft_step():
        raw = drf.feed([token])[-1]
        p = processed_probs(raw[None], settings)[0]
        sample_token(p, gen)
        p.double().cpu().numpy()
        drf.crop(len(ids))

    def verify_step(k):
        rows = ver.feed(ids[-k:] if k <= len(ids) else [token] * k)
        processed_probs(rows, settings).double().cpu().numpy()
        ver.crop(len(ids))

    bar = progress_bar(total=max_block + 5 + len(sizes), desc="calibrate", unit="part", enabled=progress)
    samples = {"verify_block": {}, "prefill": {"verifier": {}, "draft": {}}}
    with bar:
        draft_step()  # warm-up
        samples["draft_token"] = _timings(draft_step, repeats)
        draft_token = float(np.median(samples["draft_token"]))
        bar.update(1)
        verify_block = {}
        verify_step(1)
        for k in range(1, max_block + 1):
            samples["verify_block"][k] = _timings(lambda k=k: verify_step(k), repeats)
            verify_block[k] = float(np.median(samples["verify_block"][k]))
            bar.update(1)

        def crop_step():
            ver.feed([token])
            drf.feed([token])
            start = time.perf_counter()
            ver.crop(len(ids))
            drf.crop(len(ids))
            return time.perf_counter() - start

        step_overhead = float(np.median([crop_step() for _ in range(repeats)]))
        bar.update(1)
        q_row = processed_probs(ver.feed([token])[-1][None], settings)[0].double().cpu().numpy()
        p_row = processed_probs(drf.feed([token])[-1][None], settings)[0].double().cpu().numpy()
        ver.crop(len(ids))
        drf.crop(len(ids))
        coin = np.random.default_rng(0)
        drafted = int(np.argmax(p_row))
        judge_token = float(np.median(_timings(lambda: _rule_step(SpS(), p_row, q_row, drafted, None, coin, gen),
                                               repeats)))  # fmt: skip
        bar.update(1)
        prefill = {"verifier": {}, "draft": {}}
        for name, model in (("verifier", v_model), ("draft", d_model)):
            for length in lengths:

                def prefill_run(model=model, length=length):
                    return cached_model(model).feed(stream[:length], want="last")

                runs = _timings(prefill_run, min(repeats, 3))
                samples["prefill"][name][length] = runs
                prefill[name][length] = float(np.median(runs))
        bar.update(1)
        # the context slope: the same forwards after a longer context
        far = stream[:second_context]
        ver_far, drf_far = cached_model(v_model), cached_model(d_model)
        ver_far.feed(far, want="last")
        drf_far.feed(far, want="last")

        def at_far(runner, length):
            def run():
                runner.feed([token])
                runner.crop(length)

            return run

        slopes = {}
        for role, near, far_runner in (("verify", ver, ver_far), ("draft", drf, drf_far)):
            at_far(far_runner, len(far))()  # warm-up
            t_near = float(np.median(_timings(at_far(near, len(ids)), repeats)))  # the same forward, both contexts
            t_far = float(np.median(_timings(at_far(far_runner, len(far)), repeats)))
            slopes[role] = max((t_far - t_near) / (second_context - context), 0.0)
        context_slope = slopes
        bar.update(1)
        batches = {}
        for size in sizes:
            batches[size] = _batch_timings(v_model, d_model, ids, token, size, max_block, repeats, settings, gen)
            bar.update(1)
    busy = other_load(sample_start, machine_sample())
    arithmetic = dtype_and_device(v_model)
    load = {} if busy is None else {"other": busy, "cores": float(os.cpu_count() or 1)}
    source = {
        "kind": "calibration",
        "verifier": v_info,
        "draft": d_info,
        "engine": engine_of(v_model),
        "dtype": arithmetic[0],
        "device": arithmetic[1],
        "context": int(context),
        "second_context": int(second_context),
        "repeats": int(repeats),
        "sampling": settings.as_dict(),
        "threads": model_threads(v_model),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "versions": software_versions(engine_of(v_model)),
        "created": utc_timestamp(),
    }
    return CostModel(
        draft_token=draft_token,
        verify_block=verify_block,
        step_overhead=step_overhead,
        judge_token=judge_token,
        source=source,
        prefill=prefill,
        context=int(context),
        context_slope=context_slope,
        samples=samples,
        load=load,
        batch=batches,
    )


def _batch_timings(v_model, d_model, ids, token, size, max_block, repeats, settings, gen):
    """A ``CostModel.batch`` entry: the step parts with ``size`` sequences of the context ``ids``."""
    from .._math._sampling import processed_probs
    from .._models._hf import sample_token

    vers = [v_model.sequence() for _ in range(size)]
    drfs = [d_model.sequence() for _ in range(size)]
    try:
        v_model.evaluate([(q, ids, "last") for q in vers])
        d_model.evaluate([(q, ids, "last") for q in drfs])

        def draft_step():
            for q, raw in zip(drfs, d_model.evaluate([(q, [token], "all") for q in drfs]), strict=True):
                p = processed_probs(raw, settings)[0]
                sample_token(p, gen)
                p.double().cpu().numpy()
                q.crop(len(ids))

        def verify_step(k):
            block = ids[-k:] if k <= len(ids) else [token] * k
            for q, rows in zip(vers, v_model.evaluate([(q, block, "all") for q in vers]), strict=True):
                processed_probs(rows, settings).double().cpu().numpy()
                q.crop(len(ids))

        draft_step()
        verify_step(1)  # warm-ups
        samples = {"draft_token": _timings(draft_step, repeats), "verify_block": {}}
        for k in range(1, max_block + 1):
            samples["verify_block"][k] = _timings(lambda k=k: verify_step(k), repeats)
    finally:
        for q in vers + drfs:
            q.close()
    return {
        "draft_token": float(np.median(samples["draft_token"])),
        "verify_block": {k: float(np.median(v)) for k, v in samples["verify_block"].items()},
        "samples": samples,
    }
