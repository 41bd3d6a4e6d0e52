"""The GPU check: one prepared script for a GPU machine with no network and no model files.

Usage:
    python experiments/gpu_check.py [--out docs/results]                     (a CUDA GPU: minutes)
    python experiments/gpu_check.py --device cpu --small --out DIR           (a smoke test: seconds)

It builds a model pair of real shapes on the device with random weights (a verifier of
Qwen2.5-1.5B's shape: 28 layers, hidden 1536, 12 heads with 2 key-value heads, vocabulary 151,936,
bfloat16; the draft: the verifier's first ``--draft-layers`` layers, the same embeddings and head,
every layer's output projections scaled by ``--scale`` so the draft tracks the verifier: acceptance
near 0.7), a word-level tokenizer over the same vocabulary, and random prompts. Then, each against a
baseline measured in the same run:

1. the dump (``dump_trace``) in positions per second at batch 1, 8 and 64 against Hugging Face's
   own batched ``generate(output_logits=True)`` plus one teacher-forced draft forward and the same
   top-K and log-sum-exp of both models' rows brought to the host;
2. the verifier alone in ``decode`` (``autoregressive_generate_batch``, batch 1) against
   ``model.generate`` on the same prompts and lengths, tokens per second;
3. the rules' rows of ``experiments/bench.py --cuda-only`` (256 x 151,936: SpS and Cactus against the
   plain formula, validated and not);
4. ``calibrate_cost``, then the planner's predicted request speedup (from the batch-64 trace) against
   ``decode_prompts``'s measured one (other prompts, another seed) for SpS and Cactus(delta = 1) at
   m = 2, 4, 8, both with 95% intervals.

Each part's numbers go into ``gpu.json`` and the page ``gpu.md`` in ``--out`` as soon as it ends, so
a run stopped by a time limit keeps what it measured. A part that fails prints its traceback and
the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from gpu_page import page  # noqa: E402  the page of this script's results

SHAPES = {  # Qwen2.5-1.5B's configuration (its published config.json), and a tiny one for the smoke test
    "full": {
        "vocab_size": 151_936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
    },
    "small": {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
    },
}


def build_pair(shape, draft_layers, scale, device, dtype, seed=0):
    """(verifier, draft, tokenizer): random weights on ``device``; the draft shares the verifier's
    first ``draft_layers`` layers, embeddings and head (a layer-skip self-draft)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**SHAPES[shape], tie_word_embeddings=False, eos_token_id=1, bos_token_id=0)
    with torch.device(device):
        verifier = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in verifier.model.layers:  # small layer outputs: the first layers predict the rest
            layer.self_attn.o_proj.weight.mul_(scale)
            layer.mlp.down_proj.weight.mul_(scale)
    verifier = verifier.to(dtype).eval()
    small = Qwen2Config(
        **{**SHAPES[shape], "num_hidden_layers": draft_layers},
        tie_word_embeddings=False,
        eos_token_id=1,
        bos_token_id=0,
    )
    with torch.device("meta"):
        draft = Qwen2ForCausalLM(small)
    draft.model.embed_tokens = verifier.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(list(verifier.model.layers[:draft_layers]))
    draft.model.norm = verifier.model.norm
    draft.model.rotary_emb = verifier.model.rotary_emb
    draft.lm_head = verifier.lm_head
    draft = draft.to(device).eval()
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    for k, letter in enumerate("ABCDE"):  # the answer letters, single tokens: the exact referee reads them
        del vocab[f"t{config.vocab_size - 1 - k}"]
        vocab[letter] = config.vocab_size - 1 - k
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1")
    return verifier, draft, tokenizer


def make_prompts(count, vocab, seed, prefix, low=24, high=48):
    from cactus_theory.traces import Prompt

    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        words = rng.integers(2, vocab, size=int(rng.integers(low, high + 1)))
        out.append(Prompt(id=f"{prefix}-{i}", task="random", text=" ".join(f"t{w}" for w in words), index=i))
    return out


def sync(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def settings():
    from cactus_theory import SamplingSettings

    return SamplingSettings(temperature=0.6, top_k=20, top_p=0.95)  # the paper's


# --- 1. the dump ----------------------------------------------------------------------------------


def hf_dump(verifier, draft, tokenizer, prompts, batch, new_tokens, k, device):
    """What a user writes with Hugging Face alone: batched ``generate(output_logits=True)``, one
    teacher-forced draft forward over the sequences, both models' top-K and log-sum-exp to the host.
    Returns the positions produced."""
    import torch

    s = settings()
    positions = 0
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        ids = [tokenizer(p.text)["input_ids"] for p in group]
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([[0] * (width - len(x)) + x for x in ids], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
        with torch.no_grad():
            out = verifier.generate(
                input_ids=input_ids,
                attention_mask=mask,
                do_sample=True,
                temperature=s.temperature,
                top_k=s.top_k,
                top_p=s.top_p,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
            target = torch.stack(out.logits, 1).float()  # (B, T, V)
            full_mask = torch.cat([mask, torch.ones_like(out.sequences[:, width:])], 1)
            forced = draft(input_ids=out.sequences[:, :-1], attention_mask=full_mask[:, :-1]).logits[:, width - 1 :]
            for rows in (target, forced.float()):
                values, index = rows.topk(k, -1)
                lse = torch.logsumexp(rows.double(), -1)
                values.cpu(), index.cpu(), lse.cpu()
        positions += target.shape[0] * target.shape[1]
    return positions


def part_dump(ctx):
    from cactus_theory.traces import dump_trace

    rows = []
    for batch in ctx.batches:
        prompts = make_prompts(ctx.dump_prompts(batch), ctx.vocab, 1, f"dump{batch}")
        out = os.path.join(ctx.work, f"trace-b{batch}")
        hf_dump(ctx.verifier, ctx.draft, ctx.tokenizer, prompts[: max(1, batch)], batch, 4, 8, ctx.device)  # warm-up
        sync(ctx.device)
        start = time.perf_counter()
        base = hf_dump(ctx.verifier, ctx.draft, ctx.tokenizer, prompts, batch, ctx.new_tokens, 64, ctx.device)
        sync(ctx.device)
        base_s = time.perf_counter() - start
        summary = dump_trace(
            (ctx.verifier, ctx.tokenizer),
            (ctx.draft, ctx.tokenizer),
            prompts,
            out,
            settings=settings(),
            max_new_tokens=ctx.new_tokens,
            device=ctx.device,
            dtype=ctx.dtype,
            batch=batch,
            progress=False,
        )
        ours = summary.written_positions / summary.seconds
        rows.append(
            {
                "batch": batch,
                "prompts": len(prompts),
                "positions": summary.written_positions,
                "seconds": summary.seconds,
                "positions_per_second": ours,
                "hf_positions": base,
                "hf_seconds": base_s,
                "hf_positions_per_second": base / base_s,
                "ratio": ours / (base / base_s),
            }
        )
        ctx.traces[batch] = out
        print(
            f"dump batch {batch}: {ours:,.0f} positions/s, HF generate + draft forward {base / base_s:,.0f} "
            f"positions/s: {rows[-1]['ratio']:.2f}x",
            flush=True,
        )
    return rows


# --- 2. the verifier alone ------------------------------------------------------------------------


def _alone(ctx, ids, **flags):
    """``decode``'s verifier alone (batch 1, on the device) on each prompt, with the DecodeSpec ``flags``:
    (the DecodeResults, seconds)."""
    from cactus_theory.decode import DecodeSpec
    from cactus_theory.hf import decoder_for

    out, seconds = [], 0.0
    for i, x in enumerate(ids):
        spec = DecodeSpec(settings=settings(), max_new_tokens=ctx.new_tokens, **flags)
        sync(ctx.device)
        start = time.perf_counter()
        out.append(decoder_for(spec, ctx.verifier, batch=1).generate([x], [i], {1})[0])
        sync(ctx.device)
        seconds += time.perf_counter() - start
    return out, seconds


def _generate(ctx, ids, lengths, **options):
    """``model.generate`` (sampling as ours) of each prompt for its length: seconds."""
    import torch

    s, seconds = settings(), 0.0
    for x, n_out in zip(ids, lengths, strict=True):
        sync(ctx.device)
        start = time.perf_counter()
        with torch.no_grad():
            ctx.verifier.generate(
                input_ids=torch.tensor([x], device=ctx.device),
                do_sample=True,
                temperature=s.temperature,
                top_k=s.top_k,
                top_p=s.top_p,
                max_new_tokens=n_out,
                min_new_tokens=n_out,
                pad_token_id=0,
                **options,
            )
        sync(ctx.device)
        seconds += time.perf_counter() - start
    return seconds


def part_alone(ctx):
    """The verifier alone: ours eager, with the static cache, with CUDA graphs (a GPU), against
    ``model.generate`` and Hugging Face's static-cache generate (which compiles the forward with
    ``torch.compile``), each warmed up on one prompt first; the same tokens from the three of ours."""
    from cactus_theory.hf import encode_chat

    prompts = make_prompts(ctx.alone_prompts, ctx.vocab, 2, "alone")
    ids = [encode_chat(ctx.tokenizer, p.text) for p in prompts]
    variants = {"eager": {}, "static cache": {"static_cache": True}}
    if ctx.device.startswith("cuda"):
        variants["CUDA graphs"] = {"cuda_graphs": True}
    row = {"prompts": len(ids)}
    tokens_of = {}
    for name, flags in variants.items():
        _alone(ctx, ids[:1], **flags)  # warm-up: shapes, graphs captured
        got, seconds = _alone(ctx, ids, **flags)
        tokens_of[name] = [r.tokens for r in got]
        row[f"{name} tokens_per_second"] = sum(len(t) for t in tokens_of[name]) / seconds
    lengths = [len(t) for t in tokens_of["eager"]]
    row["tokens"] = sum(lengths)
    row["same_tokens"] = all(t == tokens_of["eager"] for t in tokens_of.values())
    baselines = {"model.generate": {}, "static-cache generate (compiled)": {"cache_implementation": "static"}}
    for name, options in baselines.items():
        try:
            _generate(ctx, ids[:1], lengths[:1], **options)  # warm-up (and the compile)
            row[f"{name} tokens_per_second"] = row["tokens"] / _generate(ctx, ids, lengths, **options)
        except Exception as exc:  # an older transformers without it: said on the page
            row[f"{name} error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    best = max(row[f"{v} tokens_per_second"] for v in variants)
    for name in baselines:
        if f"{name} tokens_per_second" in row:
            row[f"ratio to {name}"] = best / row[f"{name} tokens_per_second"]
    print(
        "verifier alone: "
        + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
        + " tok/s",
        flush=True,
    )
    return [row]


# --- 3. the rules' rows ---------------------------------------------------------------------------


def part_bench(ctx):
    sys.path.insert(0, HERE)
    import bench

    devices = (("cuda", "float32"), ("cuda", "bfloat16")) if ctx.device.startswith("cuda") else (("cpu", "float32"),)
    bench.TARGETS.clear()
    rows = bench.bench_rules(
        ctx.repeats, devices=devices, rows=ctx.bench_rows, vocab=ctx.bench_vocab, fused=ctx.device.startswith("cuda")
    )
    for r in rows:
        print(" | ".join(r), flush=True)
    targets = []
    for key, (what, limit, _) in bench.TARGET_LIMITS.items():
        for name, value in bench.TARGETS.items():
            if name.startswith(key + " "):
                targets.append({"target": f"{what} ({name[len(key) + 1 :]})", "measured": value, "met": value <= limit})
    return {
        "rows": [{"what": r[0], "validated": r[1], "unvalidated": r[2], "note": r[3]} for r in rows],
        "targets": targets,
    }


def part_checks(ctx):
    """The device's arithmetic against the CPU's: the random streams bit for bit, the processed rows."""
    import torch

    from cactus_theory import processed_probs
    from cactus_theory.hf import process_rows, row_uniforms

    seeds = torch.tensor([0, 1, 2**62 + 12345, 987654321987654321], dtype=torch.int64)
    counters = torch.arange(1000, dtype=torch.int64)[None, :].expand(4, -1)
    here = row_uniforms(seeds.to(ctx.device), counters.to(ctx.device)).cpu()
    same = bool(torch.equal(here, row_uniforms(seeds, counters)))
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(16, ctx.vocab, generator=gen) * 3
    logits[:, :50] = logits[:, 50:100]  # ties at every rank
    worst = 0.0
    for s in (settings(), type(settings())(temperature=1.0, top_k=0, top_p=0.9)):
        ours = process_rows(logits.to(ctx.device), s)[0].double().cpu()
        worst = max(worst, float((ours - processed_probs(logits.double(), s)).abs().max()))
    print(
        f"uniforms on the device equal the CPU's bit for bit: {same}; processed rows off by at most {worst:.1e}",
        flush=True,
    )
    return [{"uniforms_bitwise_equal": same, "processing_max_abs_difference": worst}]


# --- 4. calibrate, plan, decode -------------------------------------------------------------------


def part_plan(ctx):
    from cactus_theory import analyze_trace, decode_prompts, predict_speedup
    from cactus_theory.decode import matched_times
    from cactus_theory.plan import calibrate_cost
    from cactus_theory.traces import parse_rules

    verifier, draft = ctx.triples()
    start = time.perf_counter()
    cost = calibrate_cost(
        verifier,
        draft,
        max_block=max(ctx.ms) + 1,
        context=ctx.context,
        repeats=ctx.repeats,
        settings=settings(),
        progress=False,
        prompt_lengths=ctx.prompt_lengths,
    )
    calibrate_s = time.perf_counter() - start
    ctx.cost = cost  # the frontier's too
    spread = max(max(v) / min(v) for v in cost.samples["verify_block"].values())
    rules = parse_rules("sps,cactus", (1.0,))
    trace = ctx.traces.get(max(ctx.traces)) if ctx.traces else None
    if trace is None:
        raise RuntimeError("no trace: the dump part did not run")
    result = analyze_trace(trace, rules, ms=ctx.ms, n_boot=1000, progress=False)
    prompts = make_prompts(ctx.plan_prompts, ctx.vocab, 3, "heldout")
    lengths = [len(ctx.tokenizer(p.text)["input_ids"]) for p in prompts]
    plan = predict_speedup(
        result, cost, prompt_tokens=float(np.mean(lengths)), output_tokens=ctx.new_tokens, allow_untrusted=True
    )
    predicted = {(r["rule"], r["m"]): r for r in plan.rows if r["task"] == "all"}
    rows = []
    rng = np.random.default_rng(0)
    baseline = None
    for m in ctx.ms:  # every (rule, m) warmed up untimed first: a new shape's first steps choose kernels
        for rule in rules:
            decode_prompts(
                verifier, ctx.draft, rule, prompts[:1], m=m, settings=settings(), max_new_tokens=8, progress=False
            )
    for i, m in enumerate(ctx.ms):
        for rule in rules if i % 2 == 0 else rules[::-1]:  # the order alternates with m (ABBA)
            recs = decode_prompts(
                verifier,
                ctx.draft,
                rule,
                prompts,
                m=m,
                settings=settings(),
                max_new_tokens=ctx.new_tokens,
                seed=7,
                baseline=baseline is None,
                progress=False,
            )
            if baseline is None:
                baseline = {r["id"]: r["baseline"] for r in recs}
            for r in recs:
                r["baseline"] = baseline[r["id"]]
            times = [matched_times(r) for r in recs]
            spec = np.array([t[1][0] + t[1][1] for t in times])
            base = np.array([t[2][0] + t[2][1] for t in times])
            idx = rng.integers(len(recs), size=(2000, len(recs)))
            lo, hi = np.percentile(base[idx].sum(1) / spec[idx].sum(1), [2.5, 97.5])
            measured = float(base.sum() / spec.sum())
            steps = sum(len(r["accepted"]) for r in recs)
            al = sum(sum(r["accepted"]) for r in recs) / max(steps, 1)
            p = predicted[(rule.describe(), m)]
            decode_s = float(sum(t[1][1] for t in times))
            rows.append(
                {
                    "rule": rule.describe(),
                    "m": m,
                    "measured": measured,
                    "measured_lo": float(lo),
                    "measured_hi": float(hi),
                    "measured_al": al,
                    "trace_al": p["al"],
                    "predicted": p["request_speedup"],
                    "predicted_lo": p["request_speedup_lo"],
                    "predicted_hi": p["request_speedup_hi"],
                    "error": p["request_speedup"] / measured - 1,
                    "covered": bool(p["request_speedup_lo"] <= measured <= p["request_speedup_hi"]),
                    "step_ms": decode_s / max(steps, 1) * 1e3,
                    "tokens_per_step": al + 1,
                }
            )
            print(
                f"{rule.describe()} m={m}: predicted {p['request_speedup']:.2f}x [{p['request_speedup_lo']:.2f}, "
                f"{p['request_speedup_hi']:.2f}], measured {measured:.2f}x [{lo:.2f}, {hi:.2f}], AL {al:.2f} / "
                f"{p['al']:.2f}, {rows[-1]['step_ms']:.1f} ms a step",
                flush=True,
            )
    info = {
        "calibrate_seconds": calibrate_s,
        "draft_token_ms": cost.draft_token * 1e3,
        "verify_ms": {str(k): v * 1e3 for k, v in cost.verify_block.items()},
        "largest_spread": spread,
        "problems": cost.problems(),
        "step_overhead_ms": cost.step_overhead * 1e3,
        "alone_overhead_ms": cost.alone_overhead * 1e3,
        "loop": cost.source.get("loop"),
    }
    return {"calibration": info, "rows": rows}


# --- 5. the quality referee's throughput----------------------------------------------------------------


def part_evaluate(ctx):
    """``evaluate_rules`` at batch 64 on the device (the device decoder: no drift record) against batch 1,
    on random multiple-choice questions over the pair's word vocabulary: answers an hour."""
    from cactus_theory import evaluate_rules
    from cactus_theory.quality import load_problems
    from cactus_theory.rules import make_rules

    problems = load_problems("choice", path=ctx.choice_file())
    verifier, _ = ctx.triples()
    rules = make_rules("sps,cactus(delta=1)")
    rows = []
    for batch, chosen in ((ctx.evaluate_batch, problems), (1, problems[: max(2, len(problems) // 8)])):
        options = {"m": 4, "settings": settings(), "max_new_tokens": ctx.new_tokens, "drift": False}
        evaluate_rules(verifier, ctx.draft, chosen[:2], rules, batch=batch, progress=False, **options)  # warm-up
        sync(ctx.device)
        start = time.perf_counter()
        recs = evaluate_rules(verifier, ctx.draft, chosen, rules, batch=batch, progress=False, **options)
        sync(ctx.device)
        seconds = time.perf_counter() - start
        rows.append(
            {"batch": batch, "answers": len(recs), "seconds": seconds, "answers_per_hour": len(recs) / seconds * 3600}
        )
        per_hour = rows[-1]["answers_per_hour"]
        print(f"evaluate batch {batch}: {len(recs)} answers in {seconds:.1f} s: {per_hour:,.0f} an hour", flush=True)
    return rows


# --- 6. the engine oracle through the device decoder, and the frontier from the exact referee --------------


def part_oracle(ctx):
    """The engine oracle (``conform``) on this package's device decoder (``DecoderEngine`` path "auto":
    ``OnDevice`` where it takes the rule) for SpS and Cactus(delta = 1): the law of the first two tokens of
    random contexts against the rule's exact law, with the time a sample."""
    from cactus_theory import conform, make_rule
    from cactus_theory.decode import DecodeSpec
    from cactus_theory.oracle import DecoderEngine

    verifier, _ = ctx.triples()
    prompts = make_prompts(ctx.oracle_contexts, ctx.vocab, 11, "oracle")
    contexts = [(p.id, ctx.tokenizer(p.text)["input_ids"]) for p in prompts]
    rows = []
    for spec in ("sps", "cactus(delta=1)"):
        rule = make_rule(spec)
        decode = DecodeSpec(rule=rule, m=4, settings=settings(), batch=ctx.oracle_batch)
        engine = DecoderEngine(verifier, ctx.draft, decode, path="auto")
        sync(ctx.device)
        start = time.perf_counter()
        result = conform(engine, rule, contexts, samples=ctx.oracle_samples, tokens=2, seed=3)
        sync(ctx.device)
        seconds = time.perf_counter() - start
        samples = ctx.oracle_samples * len(contexts)
        rows.append(
            {
                "rule": rule.describe(),
                "decoder": engine.setting()["decoder"],
                "contexts": len(contexts),
                "samples": samples,
                "p_value": result.overall["p_value"],
                "detectable_tv": result.overall["median_detectable_tv"],
                "seconds": seconds,
                "samples_per_second": samples / seconds,
            }
        )
        print(f"oracle {rule.describe()}: p = {result.overall['p_value']:.3g}, {samples / seconds:.0f} samples/s")
    return rows


def part_frontier(ctx):
    """The exact referee on the random multiple-choice questions (problems a second) and the deployment
    frontier from its records, the dump's trace and the plan part's calibration."""
    from cactus_theory import deployment_frontier, exact_choice_referee
    from cactus_theory.quality import load_problems

    if ctx.cost is None or not ctx.traces:
        raise RuntimeError("no calibration or trace: the dump and plan parts did not run")
    verifier, draft = ctx.triples()
    problems = load_problems("choice", path=ctx.choice_file())
    rules = ["cactus(delta=1)", "lossy(alpha=0.5)"]
    sync(ctx.device)
    start = time.perf_counter()
    records = exact_choice_referee(verifier, draft, problems, rules, settings=settings(), progress=False)
    sync(ctx.device)
    seconds = time.perf_counter() - start
    frontier = deployment_frontier(
        ctx.traces[max(ctx.traces)], records, ctx.cost, rules=rules, ms=ctx.ms, n_boot=200, allow_untrusted=True
    )
    line = frontier.recommendation_line()
    print(f"exact referee: {len(problems) / seconds:.1f} problems/s; {line}", flush=True)
    return {
        "problems": len(problems),
        "seconds": seconds,
        "problems_per_second": len(problems) / seconds,
        "points": len(frontier.rows),
        "recommendation": line,
    }


class Context:
    def __init__(self, args):
        import torch

        small = args.small
        self.device = args.device
        self.shape_name = "a tiny Qwen2 shape" if small else "Qwen2.5-1.5B's shape"
        self.dtype = "float32" if small or args.device == "cpu" else "bfloat16"
        self.draft_layers = 2 if small else args.draft_layers
        self.scale = args.scale
        self.new_tokens = 8 if small else args.new_tokens
        self.batches = (1, 2, 4) if small else (1, 8, 64)
        self.repeats = 2 if small else 9
        self.context = 32 if small else 256
        self.prompt_lengths = (8,) if small else (32, 128, 512)
        self.ms = (2, 4) if small else (2, 4, 8)
        self.alone_prompts = 2 if small else 4
        self.plan_prompts = 3 if small else 8
        self.bench_rows, self.bench_vocab = (8, 4096) if small else (256, 151_936)
        self.evaluate_problems, self.evaluate_batch = (4, 4) if small else (64, 64)
        self.oracle_contexts, self.oracle_samples, self.oracle_batch = (2, 40, 4) if small else (4, 400, 64)
        self.cost = None
        self.traces = {}
        shape = "small" if small else "full"
        self.vocab = SHAPES[shape]["vocab_size"]
        self.verifier, self.draft, self.tokenizer = build_pair(
            shape, self.draft_layers, self.scale, self.device, getattr(torch, self.dtype)
        )
        self.work = tempfile.mkdtemp(prefix="gpu-check-")

    def triples(self):
        """The verifier's and the draft's (model, tokenizer, identity) triples: the identity a record names."""
        identity = {"name": "random-qwen2.5-1.5b-shape", "source": "built on the device", "files": {}}
        draft = {**identity, "name": f"first-{self.draft_layers}-layers"}
        return (self.verifier, self.tokenizer, identity), (self.draft, self.tokenizer, draft)

    def choice_file(self):
        """Random multiple-choice questions over the pair's word vocabulary (the referees' problems), written once."""
        path = os.path.join(self.work, "choice.jsonl")
        if not os.path.exists(path):
            rng = np.random.default_rng(5)
            with open(path, "w", encoding="utf-8") as fh:
                for _ in range(self.evaluate_problems):
                    words = lambda k: " ".join(f"t{int(i)}" for i in rng.integers(2, self.vocab - 5, size=k))  # noqa: E731
                    answer = "ABCD"[rng.integers(4)]
                    record = {"question": words(24), "choices": [words(3) for _ in range(4)], "answer": answer}
                    fh.write(json.dumps(record) + "\n")
        return path

    def dump_prompts(self, batch):
        return max(2 * batch, 8 if batch == 1 else 2 * batch)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke test)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "results"))
    parser.add_argument("--draft-layers", type=int, default=4)
    parser.add_argument("--scale", type=float, default=0.001)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--parts", default="checks,dump,alone,bench,plan,evaluate,oracle,frontier")
    args = parser.parse_args(argv)
    import torch
    import transformers

    gpu = args.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here; run with --device cpu --small for the smoke test")
    started = time.perf_counter()
    ctx = Context(args)
    results = {
        "command": "python experiments/gpu_check.py" + ("" if gpu else " --device cpu --small"),
        "environment": {
            "gpu": gpu,
            "device_name": torch.cuda.get_device_name(0) if gpu else "CPU",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
            "build_seconds": time.perf_counter() - started,
        },
        # what the page says of the pair (gpu_page.py reads it back from gpu.json)
        "context": {k: getattr(ctx, k) for k in ("shape_name", "dtype", "draft_layers", "scale", "new_tokens")},
        "parts": {},
        "errors": {},
        "seconds": {},
    }
    os.makedirs(args.out, exist_ok=True)
    runners = {
        "checks": part_checks,
        "dump": part_dump,
        "alone": part_alone,
        "bench": part_bench,
        "plan": part_plan,
        "evaluate": part_evaluate,
        "oracle": part_oracle,
        "frontier": part_frontier,
    }
    for name in args.parts.split(","):
        start = time.perf_counter()
        try:
            results["parts"][name] = runners[name](ctx)
        except Exception as exc:  # a part that fails is reported; the others still run
            traceback.print_exc()
            results["errors"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        results["seconds"][name] = time.perf_counter() - start
        with open(os.path.join(args.out, "gpu.json"), "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1, sort_keys=True, default=str)
        with open(os.path.join(args.out, "gpu.md"), "w", encoding="utf-8") as fh:
            fh.write(page(results, ctx) + "\n")  # gpu_page.py, a sibling
        print(f"[{name}: {results['seconds'][name]:.1f} s]", flush=True)
    print(f"total {time.perf_counter() - started:.1f} s; wrote {args.out}/gpu.md", flush=True)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
