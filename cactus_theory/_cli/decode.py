"""``cactus-theory decode``: real speculative decoding with any rule.
Its arguments, then the code that runs them."""

from __future__ import annotations

from ._common import (
    MODEL_MEMORY,
    _bonus_policy_option,
    _check_out,
    _CombinedSpecs,
    _count,
    _draft_mode_option,
    _gate,
    _gate_option,
    _int_at_least,
    _model_inputs,
    _model_options,
    _progress,
    _progress_options,
    _prompt_file_options,
    _prompts_from,
    _rules_epilog,
    _sampling_options,
    check_model_arguments,
    decoding_spec,
    llama_options,
)

ORDER = 4
HELP = "speculative decoding with real models and any rule, on one prompt or a file of them"


def _epilog() -> str:
    from .._data._prompts import RECORD_FORMATS

    return _rules_epilog() + "\n\n" + RECORD_FORMATS + "\n\n" + MODEL_MEMORY


#: The --help epilog, made as the parser is built (after the plugins: their rules listed).
EPILOG = _epilog
#: The library's settings as this command's flags (its refusals say them so).
FLAGS = {
    "drift": "--drift",
    "bonus_policy": "--bonus-policy",
    "static_cache": "--static-cache / --cuda-graphs",
    "fuse_rule": "--fuse-rule",
    "draft": "--draft ngram",
}


def add_arguments(c):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    c.add_argument("--verifier", required=True, help="verifier: Hugging Face id, local directory or .gguf file")
    c.add_argument("--draft", required=True, help="draft model (as --verifier), or 'ngram' for prompt lookup")
    c.add_argument(
        "--rule",
        default="cactus",
        action=_CombinedSpecs,
        help="rule spec(s), e.g. 'cactus(delta=1)' or 'sps,lossy(alpha=0.7)'; repeatable: every rule decodes every "
        "prompt, a prompt's runs alternating in short chunks, one --baseline shared",
    )
    c.add_argument("--delta", type=float, default=1.0, help="delta of a rule spec that does not set one")
    c.add_argument("-m", type=_count("m"), default=8, help="drafted tokens per verification")
    one = c.add_mutually_exclusive_group(required=True)
    one.add_argument("--prompt", default=None, help="one prompt's text")
    _prompt_file_options(c, one)
    c.add_argument("--limit", type=_int_at_least(0), default=None, help="at most this many prompts")
    c.add_argument(
        "--batch",
        type=_count("batch"),
        default=1,
        help="decode this many prompts at once, in synchronous steps, each with its own accepted length and cache "
        "rollback (either engine); --baseline then runs the verifier alone at the same batch size",
    )
    c.add_argument("--baseline", action="store_true", help="also decode every prompt with the verifier alone: speedups")
    c.add_argument("--out", default=None, help="JSON Lines of per-prompt records (appended; a rerun skips done ones)")
    c.add_argument("--max-new-tokens", type=_count("max_new_tokens"), default=128, help="tokens generated per prompt")
    _sampling_options(c)
    c.add_argument("--seed", type=_int_at_least(0), default=0, help="sampling seed")
    _model_options(c)
    _bonus_policy_option(c)
    _draft_mode_option(c)
    _gate_option(c)
    c.add_argument(
        "--drift",
        action="store_true",
        help="record per emitted token KL(pi_t || q_t) of the law the rule emitted it from, and print each answer's "
        "sum (mean over prompts, 95%% interval): the drift of a whole answer from the verifier (an upper bound of its "
        "KL, estimated without bias); token rules",
    )
    c.add_argument(
        "--static-cache",
        action="store_true",
        help="the device decoder's KV cache preallocated and every forward over every request's slot: one shape "
        "a block size (Hugging Face engine)",
    )
    c.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="--static-cache with each shape's forward captured once as a CUDA graph and replayed (a CUDA device)",
    )
    c.add_argument(
        "--fuse-rule",
        action="store_true",
        help="judge with the rule's torch path compiled by torch.compile (FusedRule; the device decoder)",
    )
    c.add_argument(
        "--draft-policy",
        default=None,
        help="stop a block early when the drafter is unsure: p-min(0.4), entropy(1), accept-prob(0.3)",
    )
    _progress_options(c)
    c.set_defaults(func=run)
    return c


def run(args) -> int:
    from .._analysis._analyze import parse_rules
    from .._analysis._decode_records import answer_drift, decoding_summary
    from .._data._prompts import Prompt
    from .._models._decoding import NgramDrafter
    from .._models._hf import load_model
    from .._studies._decoding import decode_prompts
    from .._util._results import interval

    _check_out(args, [*(args.prompts or []), *_model_inputs(args)], directory=False)
    check_model_arguments(args)
    rules = parse_rules(args.rule, [args.delta])
    # the run's spec, built and checked before any model loads; each rule checked against it
    spec = decoding_spec(args, draft_policy=args.draft_policy, gate=_gate(args))
    for rule in rules:
        checked = spec.with_rule(rule)
        if args.draft == "ngram":
            checked.check_drafter(NgramDrafter())
    if args.prompt is not None:
        prompts = [Prompt(id="prompt-0", task=args.task or "prompt", text=args.prompt, index=0)]
    else:
        prompts = _prompts_from(args)[: args.limit]
    opts = {"cache": not args.no_model_cache, "progress": _progress(args)}
    if args.engine == "llama.cpp":  # a sequence per prompt of a batch, per rule and for the baseline
        opts.update(engine="llama.cpp", sequences=args.batch * (len(rules) + 1), **llama_options(args))
    verifier = load_model(args.verifier, args.device, args.dtype, **opts)
    # the whole triple: its identity is recorded
    draft = NgramDrafter() if args.draft == "ngram" else load_model(args.draft, args.device, args.dtype, **opts)
    records = decode_prompts(verifier, draft, rules, prompts, spec, out=args.out, progress=_progress(args))
    for rule in rules:
        label = rule.describe()
        mine = [r for r in records if r["rule"] == label]
        if len(rules) > 1:
            print(f"\n{label}:")
        if args.prompt is not None:
            rec = mine[0]
            print(rec["text"])
            print(
                f"[{label} m={args.m}] {rec['tokens']} tokens, {len(rec['accepted'])} verifications, "
                f"AL {rec['al']:.2f}, vLLM mean acceptance length {1 + rec['al']:.2f}, "
                f"{rec['tokens_per_second']:.2f} tok/s "
                f"(draft {rec['draft_seconds']:.1f} s, verify {rec['verify_seconds']:.1f} s)"
            )
            if args.baseline:
                base = rec["baseline"]
                print(
                    f"[verifier alone] {base['tokens']} tokens, {base['tokens_per_second']:.2f} tok/s: speedup "
                    f"{rec['tokens_per_second'] / base['tokens_per_second']:.2f}x"
                )
                print(decoding_summary(mine, seed=args.seed))  # prefill apart, matched lengths, flags
            continue
        print(decoding_summary(mine, seed=args.seed))
    if args.drift:
        print(
            "\ndrift of whole answers: sum over the answer of KL(pi_t || q_t), mean over prompts [95% interval]; "
            "KL per emitted token"
        )
        for row in answer_drift(records, seed=args.seed):
            print(
                f"  {row['rule']:<28} {row['task']:<12} {row['prompts']:>4} prompts  answer KL "
                f"{row['answer_kl']:.4f} {interval(row['answer_kl_lo'], row['answer_kl_hi'], '.4f')}  over "
                f"{row['tokens']:.1f} tokens  KL/token {row['kl_per_token']:.5f} "
                f"{interval(row['kl_per_token_lo'], row['kl_per_token_hi'], '.5f')}"
            )
    if args.baseline and len(rules) > 1:
        print(
            "\n(one verifier-alone baseline per prompt, shared by every rule; each prompt's runs alternated in "
            "chunks of about 0.25 s)"
        )
    if args.out and args.prompt is None:
        print(f"records in {args.out}")
    return 0
