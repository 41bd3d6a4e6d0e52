"""Calibration: time a real model pair's forward passes on this machine and write a cost model
(``CostModel``) for the planner."""

from __future__ import annotations

import os
import platform
import time

import numpy as np

from .._analysis._cost import CostModel
from .._math._validation import check_int
from .._util._files import utc_timestamp
from .._util._machine import machine_sample, other_load
from ._slots import to_device

__all__ = ["LOOP_MS", "calibrate_cost", "loop_overheads"]

#: The drafts per step whose whole steps the calibration times (those below its largest block).
LOOP_MS = (1, 2, 4, 8, 16)


def _timings(fn, repeats, sync=None, warm=1):
    """``repeats`` wall times of ``fn()``, seconds, after ``warm`` untimed calls (a new shape makes the
    GPU libraries choose kernels: that first call is not a sample). ``sync`` (the device's
    synchronisation) runs before each timed call starts and inside it before it stops, so queued
    device work is counted in the call that queued it."""
    sync = sync or (lambda: None)
    for _ in range(warm):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def _synchronizer(model):
    """The synchronisation of the device ``model`` runs on (a no-op on the CPU)."""
    import torch

    from ._hf import engine_of

    if engine_of(model) == "llama.cpp":
        return lambda: None
    device = next(model.parameters()).device
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


class _HostParts:
    """The step parts as the host decoder runs them (llama.cpp: ``speculative_steps``): a forward, its
    rows processed on the host, sampled there; judging on float64 host rows."""

    def __init__(self, v_model, d_model, settings):
        from ._hf import cached_model

        self.v_model, self.d_model, self.settings = v_model, d_model, settings
        self.open = cached_model

    def draft(self, runner, token, gen):
        from .._math._sampling import processed_probs
        from ._hf import sample_token

        raw = runner.feed([token])[-1]
        p = processed_probs(raw[None], self.settings)[0]
        sample_token(p, gen)
        p.double().cpu().numpy()

    def verify(self, runner, block, gen, coin):
        from .._math._sampling import processed_probs

        processed_probs(runner.feed(block), self.settings).double().cpu().numpy()

    def judge_token(self, runner_v, runner_d, token, repeats, sync, gen):
        """Seconds SpS takes to judge one drafted token (``rule_step`` on float64 host rows)."""
        from .._math._sampling import processed_probs
        from .._rules import SpS
        from ._host_loop import rule_step

        q_row = processed_probs(runner_v.feed([token])[-1][None], self.settings)[0].double().cpu().numpy()
        p_row = processed_probs(runner_d.feed([token])[-1][None], self.settings)[0].double().cpu().numpy()
        coin = np.random.default_rng(0)
        drafted = int(np.argmax(p_row))
        return float(np.median(_timings(lambda: rule_step(SpS(), p_row, q_row, drafted, None, coin, gen), repeats)))

    def batch(self, size, ids):
        return (
            self.v_model,
            self.d_model,
            [self.v_model.sequence() for _ in range(size)],
            [self.d_model.sequence() for _ in range(size)],
        )

    def batch_draft(self, model, seqs, token, gen):
        from .._math._sampling import processed_probs
        from ._hf import sample_token

        for raw in model.evaluate([(q, [token], "all") for q in seqs]):
            p = processed_probs(raw, self.settings)[0]
            sample_token(p, gen)
            p.double().cpu().numpy()

    def batch_verify(self, model, seqs, block, gen):
        from .._math._sampling import processed_probs

        for rows in model.evaluate([(q, block, "all") for q in seqs]):
            processed_probs(rows, self.settings).double().cpu().numpy()


class _DeviceParts:
    """The step parts as the device decoder runs them (the Hugging Face engine, ``_device_decode``):
    a draft forward with its row processed and sampled on the device; a verifier block of k tokens
    with its k rows processed, the k - 1 drafts judged by SpS, the emitted token sampled and the
    step's one copy to the host (the judging is part of the block: ``judge_token`` is 0)."""

    def __init__(self, v_model, d_model, settings):
        import torch

        self.torch, self.settings = torch, settings
        self.v_model, self.d_model = v_model, d_model

    def open(self, model, slots=1, context=64):
        from ._slots import SlotModel

        return SlotModel(model, slots, context=context).sequence()

    def _seeds(self, rows, device):
        return self.torch.arange(rows, dtype=self.torch.int64, device=device)

    def draft(self, runner, token, gen):
        self.batch_draft(runner.owner, [runner], token, gen)

    def verify(self, runner, block, gen, coin):
        self.batch_verify(runner.owner, [runner], block, gen)

    def judge_token(self, runner_v, runner_d, token, repeats, sync, gen):
        return 0.0

    def batch(self, size, ids):
        from ._slots import SlotModel

        v = SlotModel(self.v_model, size, context=len(ids) + 64)
        d = SlotModel(self.d_model, size, context=len(ids) + 64)
        return v, d, [v.sequence() for _ in range(size)], [d.sequence() for _ in range(size)]

    def batch_draft(self, model, seqs, token, gen):
        from ._device_rows import process_rows, row_uniforms, sample_rows

        torch = self.torch
        ids = torch.full((len(seqs), 1), int(token), dtype=torch.int64, device=model.device)
        raw = model.forward_rows([q.slot for q in seqs], ids, [1] * len(seqs), "last")
        p, _ = process_rows(raw.float(), self.settings)
        seeds = self._seeds(len(seqs), model.device)
        sample_rows(p, row_uniforms(seeds, seeds))

    def batch_verify(self, model, seqs, block, gen):
        from .._rules import SpS
        from ._device_rows import process_rows, row_uniforms, sample_rows

        torch = self.torch
        rows, k = len(seqs), len(block)
        ids = to_device(torch, [list(block)] * rows, model.device)
        logits = model.forward_rows([q.slot for q in seqs], ids, [k] * rows, "all")
        q, bad = process_rows(logits.float().reshape(rows * k, -1), self.settings)
        q = q.reshape(rows, k, -1)
        seeds = self._seeds(rows, model.device)
        out = [bad.reshape(rows, k).any(1).to(torch.int64)]
        if k > 1:  # the k - 1 drafts judged against rows that stand in for the drafter's (the verifier's next)
            drafted = ids[:, 1:]
            a, c = SpS().acceptance_and_correction(
                q[:, 1:].reshape(rows * (k - 1), -1),
                q[:, :-1].reshape(rows * (k - 1), -1),
                drafted.reshape(-1),
                validate=False,
            )
            coins = row_uniforms(seeds, seeds[:, None] + torch.arange(k - 1, device=model.device)[None, :])
            out.append((coins < a.reshape(rows, k - 1)).to(torch.int64).sum(1))
            out.append(sample_rows(c.reshape(rows, k - 1, -1)[:, 0], row_uniforms(seeds, seeds)))
        out.append(sample_rows(q[:, -1], row_uniforms(seeds, seeds + 1)))
        torch.stack(out, 1).cpu()  # the step's one copy to the host


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
    loop=True,
):
    """Time the parts of a step for a model pair on this machine: a CostModel.

    ``verifier`` and ``draft`` are (model, tokenizer, identity) triples from ``load_model``.
    Both models first read a context of ``context`` token ids (the tokenizer's encoding of a
    fixed English text, repeated) into their KV caches; then, each a median of ``repeats``, each
    shape called once untimed first (a GPU chooses its kernels on a new shape), the device
    synchronised before each timed call starts and before it stops: one drafted token (a forward
    of one token, its processed row with ``settings``, the sampling); a verifier block of k =
    1..``max_block`` tokens (a forward and its k processed rows), the cache cropped back after
    each; the cropping itself; and judging. Each part runs as the decoder on that engine runs
    it: on the Hugging Face engine the device decoder (``_device_decode``: rows processed,
    sampled and judged on the model's device, the block's judging and the step's one copy to the
    host inside the verifier block's time, so ``judge_token`` is 0), on llama.cpp the host
    decoder (rows on the host; SpS judging one drafted token on rows of the vocabulary's size).
    Then the whole request's other parts: each model processing prompts of ``prompt_lengths``
    tokens (a fresh cache each, ``min(repeats, 3)`` times), and one drafted token and one
    verifier token at ``second_context`` tokens of context (default 2 x ``context``), whose
    difference per token is the context slope. Every timed repeat is kept (``samples``: the
    intervals and the trust checks read them; no untimed first call is among them) with the
    machine's load average before and after. Deterministic inputs; the timings are whatever this
    machine gives (run it idle: ``CostModel.problems`` says when it was not).

    ``loop`` (default): then whole steps as the decoder runs them (``_loop_timings``: the verifier alone,
    and speculative steps of the ``LOOP_MS`` drafts below ``max_block``), so the cost model holds what the loop
    costs beyond its parts (``loop_overheads``): ``step_overhead`` (at least the cropping) and
    ``alone_overhead`` (the baseline's loop); the timings are kept in ``source["loop"]``.

    ``batch``: batch sizes B whose step parts are timed too (``CostModel.batch``: B sequences, each
    with the same context, in one forward): one draft forward of B sequences with its B rows
    processed and sampled, and the verifier scoring k tokens of each of the B sequences (k =
    1..``max_block``) with the B k rows processed (and judged, on the device decoder).
    """
    import torch

    from .._math._sampling import SamplingSettings
    from .._models._hf import dtype_and_device, engine_of, model_threads, software_versions
    from .._util._progress import progress_bar

    check_int(max_block, "max_block", 1)
    check_int(repeats, "repeats", 1)
    check_int(context, "context", 1)
    lengths = sorted({int(n) for n in prompt_lengths})
    if any(n < 1 for n in lengths):
        raise ValueError(f"prompt_lengths must be integers >= 1; got {list(prompt_lengths)!r}")
    second_context = 2 * context if second_context is None else second_context
    sizes = sorted({int(b) for b in batch} - {1})
    if any(b < 1 for b in sizes) or any(isinstance(b, bool) for b in batch):
        raise ValueError(f"batch must list batch sizes >= 1; got {list(batch)!r}")
    if engine_of(verifier[0]) != engine_of(draft[0]):
        raise ValueError("the verifier and the draft run on different engines: load both on one")
    check_int(second_context, "second_context", int(context) + 1, what="longer than context")
    sample_start = machine_sample()
    settings = settings or SamplingSettings()
    v_model, tokenizer, v_info = verifier
    d_model, _, d_info = draft
    text = (
        "Speculative decoding drafts several tokens with a small model and verifies them with a large one "
        "in a single forward pass; the acceptance rule decides how many of the drafted tokens to keep. "
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if tokenizer is not None else list(range(100))
    if not ids:
        raise ValueError("the tokenizer encodes the calibration's text to no tokens: give the model's own tokenizer")
    longest = max(context, second_context, *lengths)
    stream = ids * (longest // max(len(ids), 1) + 1)
    ids = stream[:context]
    device = engine_of(v_model) != "llama.cpp"
    parts = (_DeviceParts if device else _HostParts)(v_model, d_model, settings)
    sync = _synchronizer(v_model)
    span = longest + max_block + 8
    ver = parts.open(v_model, 1, span) if device else parts.open(v_model)
    drf = parts.open(d_model, 1, span) if device else parts.open(d_model)
    ver.feed(ids, want="last")
    drf.feed(ids, want="last")
    gen = torch.Generator().manual_seed(0)
    token = ids[-1]

    def draft_step():
        parts.draft(drf, token, gen)
        drf.crop(len(ids))

    def verify_step(k):
        parts.verify(ver, ids[-k:] if k <= len(ids) else [token] * k, gen, None)
        ver.crop(len(ids))

    bar = progress_bar(total=max_block + 6 + len(sizes), desc="calibrate", unit="part", enabled=progress)
    samples = {"verify_block": {}, "prefill": {"verifier": {}, "draft": {}}}
    with bar:
        samples["draft_token"] = _timings(draft_step, repeats, sync)
        draft_token = float(np.median(samples["draft_token"]))
        bar.update(1)
        verify_block = {}
        for k in range(1, max_block + 1):  # each block length warmed up before it is timed
            samples["verify_block"][k] = _timings(lambda k=k: verify_step(k), repeats, sync)
            verify_block[k] = float(np.median(samples["verify_block"][k]))
            bar.update(1)

        def crop_step():
            ver.feed([token])
            drf.feed([token])
            sync()
            start = time.perf_counter()
            ver.crop(len(ids))
            drf.crop(len(ids))
            return time.perf_counter() - start

        crop_step()
        step_overhead = float(np.median([crop_step() for _ in range(repeats)]))
        bar.update(1)
        judge_token = parts.judge_token(ver, drf, token, repeats, sync, gen)
        ver.crop(len(ids))
        drf.crop(len(ids))
        bar.update(1)
        prefill = {"verifier": {}, "draft": {}}
        for name, model in (("verifier", v_model), ("draft", d_model)):
            runner = parts.open(model, 1, span) if device else None
            for length in lengths:

                def prefill_run(model=model, length=length, runner=runner):
                    if runner is None:
                        return parts.open(model).feed(stream[:length], want="last")
                    runner.crop(0)
                    return runner.feed(stream[:length], want="last")

                runs = _timings(prefill_run, min(repeats, 3), sync)
                samples["prefill"][name][length] = runs
                prefill[name][length] = float(np.median(runs))
        bar.update(1)
        # the context slope: the same forwards after a longer context
        far = stream[:second_context]
        ver_far = parts.open(v_model, 1, span) if device else parts.open(v_model)
        drf_far = parts.open(d_model, 1, span) if device else parts.open(d_model)
        ver_far.feed(far, want="last")
        drf_far.feed(far, want="last")

        def at(runner, length):
            def run():
                runner.feed([token])
                runner.crop(length)

            return run

        slopes = {}
        for role, near, far_runner in (("verify", ver, ver_far), ("draft", drf, drf_far)):
            t_near = float(np.median(_timings(at(near, len(ids)), repeats, sync)))  # the same forward, both contexts
            t_far = float(np.median(_timings(at(far_runner, len(far)), repeats, sync)))
            slopes[role] = max((t_far - t_near) / (second_context - context), 0.0)
        context_slope = slopes
        bar.update(1)
        batches = {}
        for size in sizes:
            batches[size] = _batch_timings(parts, ids, token, size, max_block, repeats, gen, sync)
            bar.update(1)
        whole = _loop_timings(v_model, d_model, ids, max_block, repeats, settings) if loop else None
        bar.update(1)
    crop_overhead = step_overhead
    alone_overhead = 0.0
    if whole is not None:
        step_overhead, alone_overhead = loop_overheads(whole, draft_token, verify_block, judge_token, crop_overhead)
    busy = other_load(sample_start, machine_sample())
    arithmetic = dtype_and_device(v_model)
    load = {} if busy is None else {"other": busy, "cores": float(os.cpu_count() or 1)}
    source = {
        "kind": "calibration",
        "verifier": v_info,
        "draft": d_info,
        "engine": engine_of(v_model),
        "decoder": "device" if device else "host",
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
    if whole is not None:
        source["loop"] = {
            "alone": whole["alone"],
            "steps": {str(m): t for m, t in whole["steps"].items()},
            "crop_overhead": crop_overhead,
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
        alone_overhead=alone_overhead,
    )


def _loop_timings(v_model, d_model, ids, max_block, repeats, settings):
    """Whole steps as the decoder runs them (batch 1, after the calibration's context ``ids``), seconds:
    {"alone": the verifier-alone decoder's median time between tokens, "steps": {m: the speculative
    decoder's median time between steps of m drafts}} for m = 1 .. ``max_block`` - 1. The speculative
    runs judge with the always-accept rule, so every step drafts and verifies its full m (a step's
    work does not depend on what it accepts), and emits m + 1 tokens. Each setting runs once untimed,
    then decodes ``repeats`` + 2 steps, the first of which (new shapes) is not a sample."""
    from ._clock import drain
    from ._decode_spec import DecodeSpec
    from ._decoding import decoder_for

    def step_times(spec, draft):
        decoder = decoder_for(spec, v_model, draft, batch=1)
        drain(decoder.steps([list(ids)], [1], set()))  # untimed: the loop's own first calls (lazy compiles)
        result = drain(decoder.steps([list(ids)], [0], set()))[0]
        tokens = np.asarray(result.token_seconds, dtype=float)
        per = spec.m + 1 if spec.rule is not None else 1
        durations = np.diff(np.concatenate([[0.0], tokens[per - 1 :: per]]))  # each step: to its last token
        return durations[1:]  # the first step (new shapes) is not a sample

    steps = int(repeats) + 2
    alone = step_times(DecodeSpec(settings=settings, max_new_tokens=steps), None)
    loop = {"alone": float(np.median(alone)), "steps": {}}
    for m in [m for m in LOOP_MS if m < int(max_block)]:
        spec = DecodeSpec(rule="always-accept", m=m, settings=settings, max_new_tokens=(m + 1) * steps)
        loop["steps"][m] = float(np.median(step_times(spec, d_model)))
    return loop


def loop_overheads(loop, draft_token, verify_block, judge_token=0.0, floor=0.0):
    """(step_overhead, alone_overhead) of whole-loop timings (``_loop_timings``): the median over m of
    what a step of m drafts took beyond its parts (m drafted tokens, the verifier's block of m + 1, the
    judging of m + 1 tokens), at least ``floor`` (the cropping timed alone); and what a token of the
    verifier alone took beyond ``verify_block[1]``, at least 0."""
    residuals = [
        t - (m * draft_token + verify_block[m + 1] + (m + 1) * judge_token)
        for m, t in loop["steps"].items()
        if m + 1 in verify_block
    ]
    step = max(float(floor), float(np.median(residuals))) if residuals else float(floor)
    return step, max(0.0, loop["alone"] - verify_block[1])


def _batch_timings(parts, ids, token, size, max_block, repeats, gen, sync):
    """A ``CostModel.batch`` entry: the step parts with ``size`` sequences of the context ``ids``."""
    v_model, d_model, vers, drfs = parts.batch(size, ids)
    try:
        v_model.evaluate([(q, ids, "last") for q in vers])
        d_model.evaluate([(q, ids, "last") for q in drfs])

        def draft_step():
            parts.batch_draft(d_model, drfs, token, gen)
            for q in drfs:
                q.crop(len(ids))

        def verify_step(k):
            parts.batch_verify(v_model, vers, ids[-k:] if k <= len(ids) else [token] * k, gen)
            for q in vers:
                q.crop(len(ids))

        samples = {"draft_token": _timings(draft_step, repeats, sync), "verify_block": {}}
        for k in range(1, max_block + 1):
            samples["verify_block"][k] = _timings(lambda k=k: verify_step(k), repeats, sync)
    finally:
        for q in vers + drfs:
            q.close()
    return {
        "draft_token": float(np.median(samples["draft_token"])),
        "verify_block": {k: float(np.median(v)) for k, v in samples["verify_block"].items()},
        "samples": samples,
    }
