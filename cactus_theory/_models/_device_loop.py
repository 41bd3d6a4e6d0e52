"""Decoding where the model runs: speculative decoding with a token rule, and the verifier alone, for
B prompts at once on the Hugging Face engine (``SlotModel``), the drafted and verified rows never
leaving the device. One host synchronisation per step: the step's drafted tokens, accepted counts and
emitted tokens come back in one copy.

A step drafts up to m tokens per request (one draft forward of every request per drafted place,
processed and sampled on the device), verifies every request's block in one verifier forward, and
judges it with the rule's torch path (``acceptance_and_correction`` of every drafted place at once,
``rule.at_slot(j)`` per place): a drafted token is accepted when its uniform is below the rule's
acceptance, the first rejection emits a token of the rule's correction there, and a fully accepted
block the bonus from q. Each request draws from its own streams (``row_uniforms`` of its seed: the
step, and the place or the use, as the counter), so its tokens do not depend on the requests beside
it, nor on the batch size; they equal the host decoder's (``speculative_generate``) in law, not
draw by draw (another random stream). The verifier alone samples position t of a request with the
t-th number of its stream, as the dumper does: it emits the tokens a dump of that prompt holds.

Covers token rules with the verifier's bonus, sampled or greedy drafting, and no gate, drafting
policy, drift record or raw-logit need (``OnDevice.ready``); the other options run on the host
(``_host_loop.HostBatch``), on either engine.
"""

from __future__ import annotations

import time

from ._clock import OwnClock, paused
from ._decode_spec import Decoder, DecodeResult
from ._drafters import NgramDrafter
from ._hf import engine_of
from ._host_loop import book_step
from ._slots import to_device

__all__ = ["OnDevice"]

#: Counters of a request's stream within one step: the drafted places, the coins, the emitted token.
_STEP, _COIN, _FINAL = 1 << 20, 1 << 18, 1 << 19


class OnDevice(Decoder):
    """B prompts at once on the Hugging Face engine, rows on the model's device (see the module docstring)."""

    @staticmethod
    def ready(spec, verifier, draft=None) -> bool:
        """Whether this decoder runs ``spec`` for these models: Hugging Face models (not llama.cpp, not the
        n-gram drafter); for the verifier alone always, for a rule a token rule with the verifier's bonus,
        and no gate, drafting policy, drift record or raw logits."""
        if engine_of(verifier) == "llama.cpp":
            return False
        if spec.rule is None:
            return True
        if isinstance(draft, NgramDrafter) or engine_of(draft) == "llama.cpp":
            return False
        return (
            spec.judgement.per_token
            and spec.bonus_policy == "verifier"
            and spec.draft_policy is None
            and spec.gate is None
            and not spec.drift
            and not spec.need_logits
        )

    def _run(self, prompts_ids, seeds, eos_ids):
        spec = self.spec
        if spec.rule is None:
            return (
                yield from _autoregressive_steps(
                    self.verifier, prompts_ids, seeds, spec.settings, spec.max_new_tokens, eos_ids, spec
                )
            )
        return (yield from _speculative_steps(self.verifier, self.draft, spec, prompts_ids, seeds, eos_ids))


def _graph_kind(device):
    """The graphs of a ``cuda_graphs`` run on ``device``: CUDA's (the tests' CPU stand-in replaces this)."""
    if device.type != "cuda":
        raise ValueError(
            f"cuda_graphs captures CUDA graphs: the models are on {device}; on the CPU decode with static_cache alone"
        )
    return "cuda"


def _slots(model, count, prompts_ids, max_new_tokens, m=0, spec=None):
    """The slots of ``count`` requests: the whole length preallocated, and (``spec.static_cache``) every
    forward over the whole span, through graphs where ``spec.cuda_graphs`` asks."""
    from ._slots import SlotModel

    longest = max(len(x) for x in prompts_ids) + max_new_tokens + m + 2
    static = spec is not None and spec.static_cache
    graphs = _graph_kind(next(model.parameters()).device) if spec is not None and spec.cuda_graphs else None
    return SlotModel(model, count, context=longest, fixed_span=static, graphs=graphs)


def _forward(slots, rows, ids, counts, want, static):
    """``slots.forward_rows`` of the slot numbers ``rows`` (token rows ``ids`` (R, T), left-padded, and their
    counts). ``static``: every slot runs (the others as padding of count 0), so the forward's shape is the
    number of slots and T alone; the asked rows' logits come back in their order."""
    if not static:
        return slots.forward_rows(rows, ids, counts, want)
    torch = slots.torch
    every = torch.full((slots.sequences, ids.shape[1]), slots.pad_token, dtype=ids.dtype, device=ids.device)
    index = to_device(torch, list(rows), ids.device)
    every.index_copy_(0, index, ids)
    all_counts = [0] * slots.sequences
    for row, count in zip(rows, counts, strict=True):
        all_counts[row] = count
    logits = slots.forward_rows(list(range(slots.sequences)), every, all_counts, want, all_slots=True)
    return logits.index_select(0, index)


def _left_padded(torch, lists, pad, device):
    width = max(len(x) for x in lists)
    return to_device(torch, [[pad] * (width - len(x)) + list(x) for x in lists], device)


def _autoregressive_steps(model, prompts_ids, seeds, sampling, max_new_tokens, eos_ids, spec=None):
    """The verifier alone on B prompts at once, on the device: a generator of steps whose value is
    one ``DecodeResult`` per prompt (timed as ``speculative_batch_steps`` times them)."""
    import torch

    from ._device_rows import process_rows, row_uniforms, sample_rows

    slots = _slots(model, len(prompts_ids), prompts_ids, max_new_tokens, spec=spec)
    static = spec is not None and spec.static_cache
    device = slots.device
    clock = OwnClock()
    seqs = [slots.sequence() for _ in prompts_ids]
    results = [DecodeResult(tokens=[]) for _ in prompts_ids]
    ids = _left_padded(torch, prompts_ids, slots.pad_token, device)
    logits = slots.forward_rows([q.slot for q in seqs], ids, [len(x) for x in prompts_ids], "last")
    seed_t = to_device(torch, [int(s) for s in seeds], device)
    for res in results:
        res.prefill_seconds = clock.elapsed()
    yield from paused(clock)
    active = list(range(len(seqs)))
    while active:
        index = to_device(torch, active, device)
        probs, bad = process_rows(logits.float(), sampling)
        where = to_device(torch, [len(results[b].tokens) for b in active], device)
        drawn = sample_rows(probs, row_uniforms(seed_t.index_select(0, index), where))
        host = torch.stack([drawn, bad.to(torch.int64)], 1).cpu().numpy()  # the step's one synchronisation
        going = []
        for r, b in enumerate(active):
            _refuse_bad(host[r, 1], "verifier")
            res = results[b]
            res.tokens.append(int(host[r, 0]))
            res.token_seconds.append(clock.elapsed() - res.prefill_seconds)
            if res.tokens[-1] in eos_ids or len(res.tokens) >= max_new_tokens:
                res.total_seconds = res.verify_seconds = clock.elapsed()
                seqs[b].close()
            else:
                going.append(r)
        active = [active[r] for r in going]
        if active:
            fed = drawn.index_select(0, to_device(torch, going, device))[:, None]
            logits = _forward(slots, [seqs[b].slot for b in active], fed, [1] * len(active), "last", static)
            yield from paused(clock)
    slots.close()
    return results


def _refuse_bad(flag, role):
    if flag:
        raise ValueError(
            f"the {role}'s logits contain NaN or mask every token (overflow in float16?): decode in float32 or bfloat16"
        )


class _Request:
    """One request of a device batch: its context, result, caches and per-step budget."""

    def __init__(self, ids, seed, ver, drf):
        self.context, self.seed, self.ver, self.drf = list(ids), int(seed), ver, drf
        self.result = DecodeResult(tokens=[])


def _speculative_steps(verifier, draft, spec, prompts_ids, seeds, eos_ids):
    """Speculative decoding of B prompts at once on the device (see the module docstring) under the
    checked ``spec``: a generator of steps whose value is one ``DecodeResult`` per prompt, timed as
    ``speculative_batch_steps`` times them."""
    import torch

    m, max_new_tokens = spec.m, spec.max_new_tokens
    from ._device_rows import process_rows, row_uniforms, sample_rows

    v_slots = _slots(verifier, len(prompts_ids), prompts_ids, max_new_tokens, m, spec)
    d_slots = _slots(draft, len(prompts_ids), prompts_ids, max_new_tokens, m, spec)
    static = spec.static_cache
    device = v_slots.device
    reqs = [
        _Request(ids, seed, v_slots.sequence(), d_slots.sequence())
        for ids, seed in zip(prompts_ids, seeds, strict=True)
    ]
    clock = OwnClock()
    heads = [r.context[:-1] for r in reqs]
    for slots, attr in ((v_slots, "ver"), (d_slots, "drf")):
        live = [(getattr(r, attr), h) for r, h in zip(reqs, heads, strict=True) if h]
        if live:
            ids = _left_padded(torch, [h for _, h in live], slots.pad_token, device)
            slots.forward_rows([q.slot for q, _ in live], ids, [len(h) for _, h in live], "last")
    for r in reqs:
        r.result.prefill_seconds = clock.elapsed()
    yield from paused(clock)
    greedy = spec.draft_mode == "greedy"
    active = list(reqs)
    while active:
        t0 = time.perf_counter()
        budgets = [min(m, max_new_tokens - len(r.result.tokens)) for r in active]
        width = max(budgets)
        seeds_t = to_device(torch, [r.seed for r in active], device)
        base = to_device(torch, [len(r.result.accepted) * _STEP for r in active], device)
        # draft: the context the draft cache lacks (one token, or two after a fully accepted block), then its drafts
        feeds = [r.context[r.drf.length :] for r in active]
        fed = _left_padded(torch, feeds, d_slots.pad_token, device)
        counts = [len(f) for f in feeds]
        drafted, p_rows = [], []
        for j in range(width):
            raw = _forward(d_slots, [r.drf.slot for r in active], fed, counts, "last", static)
            p, bad_p = process_rows(raw.float(), spec.settings)
            if greedy:
                token = p.argmax(-1)
                p = torch.zeros_like(p).scatter_(-1, token[:, None], 1.0)
            else:
                token = sample_rows(p, row_uniforms(seeds_t, base + j))
            drafted.append(token)
            p_rows.append(p)
            fed, counts = token[:, None], [1] * len(active)
            if j == 0:
                bad_draft = bad_p
            else:
                bad_draft = bad_draft | bad_p
        drafted = torch.stack(drafted, 1)  # (A, width)
        t1 = time.perf_counter()
        # verify: [last context token, the request's own drafts], left-padded
        blocks = torch.cat([to_device(torch, [[r.context[-1]] for r in active], device), drafted], 1)
        v_counts = [b + 1 for b in budgets]
        if min(budgets) < width:  # shorter blocks near max_new_tokens: shift each row's tokens to the right end
            shift = to_device(torch, [width - b for b in budgets], device)
            cols = (torch.arange(width + 1, device=device)[None, :] - shift[:, None]).clamp_(min=0)
            blocks = blocks.gather(1, cols)
        logits = _forward(v_slots, [r.ver.slot for r in active], blocks, v_counts, "all", static)
        q, bad_q = process_rows(logits.float().reshape(-1, logits.shape[-1]), spec.settings)
        q = q.reshape(len(active), width + 1, -1)
        if min(budgets) < width:  # each row's q at its drafted places: aligned back to the left
            take = (torch.arange(width + 1, device=device)[None, :] + shift[:, None]).clamp_(max=width)
            q = q.gather(1, take[:, :, None].expand(-1, -1, q.shape[-1]))
        tau, final, flags, settle = _judge_block(
            spec, torch.stack(p_rows, 1), q, drafted, budgets, seeds_t, base, row_uniforms, sample_rows, device
        )
        bad = bad_q.reshape(len(active), width + 1).any(1) | bad_draft
        parts = [drafted, tau[:, None], final[:, None], bad.to(torch.int64)[:, None]]
        if flags is not None:  # the rule's own repairs, read with the step's copy
            parts.append(flags.to(torch.int64)[None, :].expand(len(active), -1))
        host = torch.cat(parts, 1).cpu().numpy()  # the step's one synchronisation
        if flags is not None:
            values = host[0, width + 3 :]
            if values.any():  # a repaired correction (rare): its emitted tokens drawn again
                host[:, width + 1] = settle(values)
            host = host[:, : width + 3]
        t2 = time.perf_counter()
        still = []
        for i, r in enumerate(active):
            _refuse_bad(host[i, -1], "verifier or the draft")
            n_acc, emitted = _emitted(host[i], budgets[i], width, eos_ids)
            keep = len(r.context) + n_acc
            r.ver.crop(keep)
            r.drf.crop(keep)
            if not book_step(r, (budgets[i], n_acc, emitted, [], t1 - t0, t2 - t1), max_new_tokens, clock, eos_ids):
                still.append(r)
        active = still
        if active:
            yield from paused(clock)
    v_slots.close()
    d_slots.close()
    return [r.result for r in reqs]


def _emitted(row, budget, width, eos_ids):
    """(accepted drafts, tokens emitted) of one request from its host row [drafts | tau | final | bad]:
    the accepted drafts, cut after an accepted end token, then the correction or the bonus."""
    drafts = [int(t) for t in row[:budget]]
    tau, final = int(row[width]), int(row[width + 1])
    end = next((j for j in range(tau) if drafts[j] in eos_ids), None)
    if end is not None:  # an accepted end token ends the output there
        return end + 1, drafts[: end + 1]
    return tau, [*drafts[:tau], final]


def _judge_block(spec, p, q, drafted, budgets, seeds, base, row_uniforms, sample_rows, device):
    """The rule's verdict on every request's block, on the device: (tau (A,): drafts accepted, the
    emitted token (A,): the correction at the first rejection, or the bonus from q after all the
    request's ``budgets`` drafts, the rule's pending flags (a device tensor or None: read back with
    the step's copy), ``settle(values)``: applies the rule's repairs for those flags and returns
    the emitted tokens drawn again from the repaired laws). ``p`` (A, m, V), ``q`` (A, m + 1, V),
    ``drafted`` (A, m)."""
    import torch

    from .._math._validation import Pending

    rule = spec.rule
    if spec.fuse_rule:
        from ._fused import fused

        rule = fused(rule)
    rows, width, vocab = p.shape
    pending = Pending()
    if spec.judgement.slot_dependent:
        parts = [
            rule.at_slot(j).acceptance_and_correction(p[:, j], q[:, j], drafted[:, j], validate=False, pending=pending)
            for j in range(width)
        ]
        accept = torch.stack([a for a, _ in parts], 1)
        correction = torch.stack([c for _, c in parts], 1)
    else:
        a, c = rule.acceptance_and_correction(
            p.reshape(-1, vocab), q[:, :width].reshape(-1, vocab), drafted.reshape(-1), validate=False, pending=pending
        )
        accept, correction = a.reshape(rows, width), c.reshape(rows, width, vocab)
    coins = row_uniforms(seeds, base[:, None] + _COIN + torch.arange(width, device=device)[None, :])
    valid = torch.arange(width, device=device)[None, :] < to_device(torch, budgets, device)[:, None]
    stop = torch.cat(
        [~(coins < accept.to(torch.float64)) | ~valid, torch.ones((rows, 1), dtype=torch.bool, device=device)], 1
    )
    tau = stop.to(torch.int8).argmax(1)
    rejected = tau < to_device(torch, budgets, device)
    at = tau.clamp(max=width - 1)
    every = torch.arange(rows, device=device)

    def emit():
        law = torch.where(rejected[:, None], correction[every, at].to(q.dtype), q[every, tau])
        return sample_rows(law, row_uniforms(seeds, base + _FINAL))

    def settle(values):
        pending.settle(values)  # per-call repairs of the correction (rows with no residual mass)
        return emit().cpu().numpy()

    return tau, emit(), pending.flags(), settle
