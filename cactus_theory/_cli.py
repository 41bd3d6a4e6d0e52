"""Command-line interface: ``cactus-theory`` / ``python -m cactus_theory``."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from ._divergences import available_divergences, binary_divergence, get_divergence
from ._gamma import APPROX_METHODS, approx_gamma, exact_gamma

__all__ = ["main"]


def _gamma_table(target_prob: float, delta: float, divergence: str, draft_prob: float | None):
    div = get_divergence(divergence)
    rows = [("exact", float(exact_gamma(target_prob, delta, div)))]
    for method in APPROX_METHODS:
        try:
            rows.append((method, float(approx_gamma(target_prob, delta, div, method=method))))
        except ValueError:  # a method this divergence does not support (e.g. no f''')
            continue
    table = []
    for method, gamma in rows:
        achieved = float(binary_divergence(gamma, target_prob, div))
        row = {
            "method": method,
            "gamma": gamma,
            "divergence": achieved,
            "within_delta": bool(achieved <= delta * (1 + 1e-12)),
        }
        if draft_prob is not None:
            row["acceptance"] = 1.0 if draft_prob == 0 else min(1.0, gamma / draft_prob)
        table.append(row)
    return table


def _cmd_gamma(args) -> int:
    table = _gamma_table(args.target_prob, args.delta, args.divergence, args.draft_prob)
    if args.json:
        print(
            json.dumps(
                {
                    "target_prob": args.target_prob,
                    "delta": args.delta,
                    "divergence": args.divergence,
                    "draft_prob": args.draft_prob,
                    "rows": table,
                },
                indent=2,
            )
        )
        return 0
    div = get_divergence(args.divergence)
    print(
        f"Cactus bonus gamma for q(n) = {args.target_prob:g}, delta = {args.delta:g}, divergence {div.name} "
        f"({div.description})"
    )
    header = f"{'method':<8} {'gamma':>16} {'achieved D_f(h||q)':>20} {'<= delta':>9}"
    if args.draft_prob is not None:
        header += f" {'P(accept) p(n)=' + format(args.draft_prob, 'g'):>22}"
    print(header)
    for row in table:
        line = (
            f"{row['method']:<8} {row['gamma']:>16.12f} {row['divergence']:>20.12g} "
            f"{'yes' if row['within_delta'] else 'NO':>9}"
        )
        if "acceptance" in row:
            line += f" {row['acceptance']:>22.12f}"
        print(line)
    print(
        "exact: root of B_f(gamma; q) = delta on [q, 1] (clipped to 1); taylor: Corollary 5; safe: provably <= delta."
    )
    return 0


def _floats(text: str):
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers; got {text!r}") from None


def _ints(text: str):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers; got {text!r}") from None


def _cmd_dump(args) -> int:
    from ._dump import dump_trace, load_completions
    from ._prompts import load_prompts
    from ._sampling import SamplingSettings

    prompts = []
    for path in args.prompts:
        prompts.extend(load_prompts(path, limit=args.per_file))
    completions = None
    if args.completions:
        completions = load_completions(args.completions)
        known = {p.id for p in prompts}
        unknown = sorted(set(completions) - known)
        if unknown:
            raise ValueError(
                f"--completions: {len(unknown)} id(s) match no prompt, e.g. {unknown[:3]}; prompt ids look like "
                f"{sorted(known)[:3]}"
            )
        skipped = len(prompts) - len(completions)
        prompts = [p for p in prompts if p.id in completions]
        if skipped:
            print(f"{skipped} prompt(s) without a completion skipped")
    settings = SamplingSettings(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    n = dump_trace(
        args.verifier,
        args.draft,
        prompts,
        args.out,
        completions=completions,
        settings=settings,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        top_k=args.top_logits,
        limit=args.limit,
        store_full=args.full_rows,
        shard_positions=args.shard_positions,
    )
    print(f"wrote {n} positions to {args.out}")
    return 0


def _cmd_analyze(args) -> int:
    from ._analysis import analyze_trace, parse_rules, write_outputs
    from ._sampling import SamplingSettings
    from ._trace import load_trace

    trace = load_trace(args.trace)
    settings = None
    if args.temperature is not None:
        settings = SamplingSettings(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    rules = parse_rules(args.rules, args.delta)
    result = analyze_trace(
        trace,
        rules,
        ms=args.m,
        settings=settings,
        n_boot=args.bootstrap,
        processes=args.processes,
        progress=not args.quiet,
        bonus_policy=args.bonus_policy,
    )
    print(f"trace {trace.directory}: {len(trace)} sequences, {trace.n_positions} positions; settings {result.settings}")
    print(result.table())
    if args.out:
        for path in write_outputs(result, args.out, figures=not args.no_figures):
            print(f"wrote {path}")
    return 0


def _cmd_decode(args) -> int:
    from ._analysis import parse_rules
    from ._decode import NgramDrafter, speculative_generate
    from ._dump import encode_chat, load_model
    from ._sampling import SamplingSettings

    verifier, tokenizer, _ = load_model(args.verifier, args.device, args.dtype)
    draft = NgramDrafter() if args.draft == "ngram" else load_model(args.draft, args.device, args.dtype)[0]
    rules = parse_rules([args.rule], [args.delta])
    if len(rules) != 1:
        raise ValueError(f"--rule must name one rule; {args.rule!r} gives {len(rules)}")
    (rule,) = rules
    settings = SamplingSettings(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    eos = {tokenizer.eos_token_id} - {None}
    out = speculative_generate(
        verifier,
        draft,
        rule,
        args.m,
        settings,
        args.max_new_tokens,
        args.seed,
        encode_chat(tokenizer, args.prompt),
        eos,
        bonus_policy=args.bonus_policy,
    )
    print(tokenizer.decode(out.tokens, skip_special_tokens=True))
    print(
        f"[{rule.describe()} m={args.m}] {len(out.tokens)} tokens, {len(out.accepted)} verifications, "
        f"AL {out.accepted_length:.2f}, vLLM mean acceptance length {out.mean_acceptance_length:.2f}, "
        f"{out.tokens_per_second:.2f} tok/s (draft {out.draft_seconds:.1f} s, verify {out.verify_seconds:.1f} s)"
    )
    return 0


def _cmd_rules(args) -> int:
    from ._rules import available_rules

    infos = available_rules()
    if args.json:
        print(
            json.dumps(
                {
                    name: {
                        "parameters": {k: _jsonable(v) for k, v in i.parameters.items()},
                        "fixed": i.fixed,
                        "summary": i.summary,
                    }
                    for name, i in infos.items()
                },
                indent=1,
            )
        )
        return 0
    width = max(len(i.signature()) for i in infos.values())
    for info in infos.values():
        print(f"{info.signature():<{width}}  {info.summary}")
    return 0


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def _rules_epilog() -> str:
    from ._rules import available_rules

    names = ", ".join(available_rules())
    return (
        "Rules are spec strings 'name(key=value, ...)', comma-separated, e.g. "
        "'sps,cactus(delta=1),rfsd(divergence=js, threshold=0.2)'; rules with a delta they do not set are "
        f"built once per --delta value. Registered: {names}. 'cactus-theory rules' lists their parameters."
    )


def _cmd_report(args) -> int:
    from ._report import build_report

    table = build_report(args.out, trace=args.trace, progress=not args.quiet)
    print(table)
    print(f"report written to {os.path.join(args.out, 'report.md')} and report.html")
    return 0


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0 or np.isnan(value):
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1]; got {text}")
    return value


def _budget(text: str) -> float:
    value = float(text)
    if np.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a divergence budget >= 0; got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cactus-theory",
        description="Theory and simulation of speculative-decoding acceptance rules (Cactus, ICLR 2026).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gamma", help="exact and approximate Cactus bonus gamma for one q(n) and delta")
    g.add_argument(
        "--target-prob", type=_probability, required=True, help="verifier probability q(n) of the drafted token"
    )
    g.add_argument("--delta", type=_budget, required=True, help="divergence budget delta >= 0")
    g.add_argument("--divergence", default="kl", choices=available_divergences(), help="f-divergence (default kl)")
    g.add_argument(
        "--draft-prob", type=_probability, default=None, help="draft probability p(n): also print min(1, gamma/p(n))"
    )
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g.set_defaults(func=_cmd_gamma)

    d = sub.add_parser("dump", help="dump a logit trace from a verifier and a draft model")
    d.add_argument("--verifier", required=True, help="Hugging Face id, local directory or .gguf file")
    d.add_argument("--draft", required=True, help="Hugging Face id, local directory or .gguf file")
    d.add_argument(
        "--prompts", required=True, nargs="+", help="benchmark files (GSM8K, HumanEval, MBPP, MT-Bench, ...)"
    )
    d.add_argument("--out", required=True, help="trace directory (resumed if it exists)")
    d.add_argument("--device", default="cpu", help="cpu or cuda")
    d.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    d.add_argument("--max-new-tokens", type=int, default=128)
    d.add_argument("--limit", type=int, default=None, help="at most this many prompts in this run")
    d.add_argument("--per-file", type=int, default=None, help="first N prompts of each file")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--temperature", type=float, default=0.6)
    d.add_argument("--top-k", type=int, default=20)
    d.add_argument("--top-p", type=float, default=0.95)
    d.add_argument("--top-logits", type=int, default=64, help="logits kept per row (K)")
    d.add_argument("--full-rows", action="store_true", help="also store full logit rows")
    d.add_argument(
        "--shard-positions",
        type=int,
        default=2048,
        help="positions per shard: a SIGKILL loses at most the completed sequences not yet in a shard "
        "(Ctrl-C and SIGTERM lose nothing complete)",
    )
    d.add_argument(
        "--completions",
        default=None,
        help="JSON Lines of {id, token_ids}: teacher-force both models on these outputs instead of sampling "
        "(--max-new-tokens: the limit they were generated with)",
    )
    d.set_defaults(func=_cmd_dump)

    a = sub.add_parser("analyze", help="acceptance, AL and emitted drift of rules on a trace", epilog=_rules_epilog())
    a.add_argument("trace", nargs="?", default=None, help="trace directory (default: the embedded trace)")
    a.add_argument("--rules", default="sps,tas,cactus,cactus-exact,mentored", help="rule specs (see below)")
    a.add_argument("--delta", type=_floats, default=[0.25, 0.5, 1.0, 2.0])
    a.add_argument("--m", type=_ints, default=[4, 8, 20])
    a.add_argument("--temperature", type=float, default=None, help="override the trace's sampling settings")
    a.add_argument("--top-k", type=int, default=20)
    a.add_argument("--top-p", type=float, default=0.95)
    a.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the 95%% intervals")
    a.add_argument("--processes", type=int, default=1)
    a.add_argument("--out", default=None, help="write analysis.csv, analysis.json and figures here")
    a.add_argument("--no-figures", action="store_true")
    a.add_argument(
        "--bonus-policy",
        choices=("verifier", "relaxed"),
        default="verifier",
        help="bonus token after m accepted drafts: from q (verifier) or one more step of the rule (relaxed)",
    )
    a.add_argument("--quiet", action="store_true")
    a.set_defaults(func=_cmd_analyze)

    c = sub.add_parser("decode", help="speculative decoding with real models and any rule", epilog=_rules_epilog())
    c.add_argument("--verifier", required=True)
    c.add_argument("--draft", required=True, help="a model, or 'ngram' for prompt lookup")
    c.add_argument("--rule", default="cactus", help="one rule spec, e.g. 'cactus(delta=1)' or 'lossy(alpha=0.7)'")
    c.add_argument("--delta", type=float, default=1.0, help="delta of a rule spec that does not set one")
    c.add_argument(
        "--bonus-policy",
        choices=("verifier", "relaxed"),
        default="verifier",
        help="bonus token after m accepted drafts: from q (verifier) or one more step of the rule (relaxed)",
    )
    c.add_argument("-m", type=int, default=8, help="drafted tokens per verification")
    c.add_argument("--prompt", required=True)
    c.add_argument("--max-new-tokens", type=int, default=128)
    c.add_argument("--temperature", type=float, default=0.6)
    c.add_argument("--top-k", type=int, default=20)
    c.add_argument("--top-p", type=float, default=0.95)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--device", default="cpu")
    c.add_argument("--dtype", default="float32")
    c.set_defaults(func=_cmd_decode)

    rl = sub.add_parser("rules", help="list the registered acceptance rules with their parameters and defaults")
    rl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rl.set_defaults(func=_cmd_rules)

    r = sub.add_parser("report", help="the main job: a report from the embedded trace and a synthetic suite")
    r.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    r.add_argument("--out", default="cactus_report", help="output directory")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(func=_cmd_report)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"cactus-theory: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
