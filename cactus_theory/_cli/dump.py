"""``cactus-theory dump``: a logit trace of a verifier and a draft model on prompts.
Its arguments, then the code that runs them."""

from __future__ import annotations

from ._common import (
    MODEL_MEMORY,
    _check_out,
    _Formatter,
    _int_at_least,
    _model_inputs,
    _model_options,
    _part,
    _progress,
    _progress_options,
    _prompt_file_options,
    _prompts_from,
    _sampling_options,
    _settings,
)

ORDER = 2


def add_parser(sub):
    """The subparser of this command."""
    from .._data._prompts import RECORD_FORMATS

    d = sub.add_parser(
        "dump",
        help="dump a logit trace from a verifier and a draft model",
        formatter_class=_Formatter,
        epilog=RECORD_FORMATS + "\nModels: a Hugging Face id, a local directory, or a .gguf file.\n\n" + MODEL_MEMORY,
    )
    d.add_argument("--verifier", required=True, help="verifier: Hugging Face id, local directory or .gguf file")
    d.add_argument("--draft", required=True, help="draft model: Hugging Face id, local directory or .gguf file")
    _prompt_file_options(d)
    d.add_argument("--out", required=True, help="trace directory (resumed if it exists)")
    _model_options(d)
    d.add_argument("--max-new-tokens", type=_int_at_least(1), default=128, help="tokens generated per prompt")
    d.add_argument("--limit", type=_int_at_least(0), default=None, help="at most this many prompts in this run")
    d.add_argument(
        "--seed", type=_int_at_least(0), default=0, help="sampling seed (each prompt's comes from it and its id)"
    )
    _sampling_options(d)
    d.add_argument("--top-logits", type=_int_at_least(1), default=64, help="logits kept per row (K)")
    d.add_argument("--full-rows", action="store_true", help="also store full logit rows")
    d.add_argument(
        "--shard-positions",
        type=_int_at_least(1),
        default=2048,
        help="positions per shard: a SIGKILL loses at most the completed sequences not yet in a shard "
        "(Ctrl-C and SIGTERM lose nothing complete)",
    )
    d.add_argument(
        "--part",
        type=_part,
        default=None,
        metavar="I/N",
        help="dump only part I of N of the prompts (chosen by prompt id): one part per GPU or host, each into "
        "its own --out; combine them with 'cactus-theory merge'",
    )
    d.add_argument(
        "--completions",
        default=None,
        help="JSON Lines of {id, token_ids}: teacher-force both models on these outputs instead of sampling "
        "(--max-new-tokens: the limit they were generated with)",
    )
    _progress_options(d)
    d.set_defaults(func=run)
    return d


def run(args) -> int:
    from .._models._dump import dump_trace, load_completions

    _check_out(args, [*args.prompts, args.completions, *_model_inputs(args)])
    prompts = _prompts_from(args)
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
    settings = _settings(args)
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
        progress=_progress(args),
        cache=not args.no_model_cache,
        part=args.part,
        engine=args.engine,
    )
    print(f"wrote {n} positions to {args.out}" + (f" (part {args.part[0]}/{args.part[1]})" if args.part else ""))
    return 0
