"""``cactus-theory dump``: a logit trace of a verifier and a draft model on prompts.
Its arguments, then the code that runs them."""

from __future__ import annotations

from ._common import (
    MODEL_MEMORY,
    _check_out,
    _count,
    _int_at_least,
    _model_inputs,
    _model_options,
    _pair_or_servers,
    _part,
    _positive_float,
    _progress,
    _progress_options,
    _prompt_file_options,
    _prompts_from,
    _sampling_options,
    _settings,
    check_model_arguments,
)

ORDER = 2
HELP = "dump a logit trace from a verifier and a draft model"


def _epilog() -> str:
    from .._data._prompts import RECORD_FORMATS

    return RECORD_FORMATS + "\nModels: a Hugging Face id, a local directory, or a .gguf file.\n\n" + MODEL_MEMORY


#: The --help epilog, made as the parser is built.
EPILOG = _epilog


def add_arguments(d):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    from .._servers._protocols import protocol_names

    s = _pair_or_servers(
        d,
        "from running servers (instead of --verifier / --draft)",
        "the verifier server generates with its top-K log-probs; the draft server is teacher-forced on its tokens "
        "(docs: Traces from servers)",
        "the verifier's server, e.g. http://127.0.0.1:8080",
    )
    protocols = ("auto", *protocol_names())  # the registered ones, a --plugin module's included
    s.add_argument("--protocol", choices=protocols, default="auto", help="the servers' API (auto: asked of the server)")
    s.add_argument("--draft-protocol", choices=protocols, default=None, help="the draft's API (default: --protocol)")
    s.add_argument("--concurrency", type=_int_at_least(1), default=1, help="requests in flight")
    s.add_argument("--timeout", type=_positive_float, default=600.0, help="seconds a request may take")
    s.add_argument("--retries", type=_int_at_least(0), default=4, help="retries on 429 / 503 / dropped connections")
    s.add_argument(
        "--draft-api-key-env", default=None, metavar="NAME", help="the draft server's key (default: the same)"
    )
    s.add_argument(
        "--prompt-format",
        choices=("chat", "raw"),
        default="chat",
        help="chat: the verifier server's chat template around each prompt; raw: the text",
    )
    s.add_argument(
        "--tokenizer",
        default=None,
        help="a Hugging Face tokenizer for servers without a tokenize endpoint (SGLang): prompt ids and chat template",
    )
    s.add_argument("--vocab-size", type=_int_at_least(2), default=None, help="where the servers do not state it")
    _prompt_file_options(d)
    d.add_argument("--out", required=True, help="trace directory (resumed if it exists)")
    _model_options(d)
    d.add_argument("--max-new-tokens", type=_count("max_new_tokens"), default=128, help="tokens generated per prompt")
    d.add_argument("--limit", type=_int_at_least(0), default=None, help="at most this many prompts in this run")
    d.add_argument(
        "--batch",
        type=_count("batch"),
        default=None,
        help="sequences generated at once (a KV cache slot each; a prompt's tokens do not depend on the batch); "
        "default 1, or the batch the trace being resumed was dumped with",
    )
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


def _run_servers(args) -> int:
    from .._models._hf import prompt_ids_with
    from .._servers._dump import dump_server_trace

    if args.verifier or args.draft:
        raise ValueError("give either --server / --draft-server or --verifier / --draft, not both")
    if not args.draft_server:
        raise ValueError(
            "--server needs --draft-server: the draft model's server (teacher-forced on the verifier's tokens)"
        )
    for flag in ("completions", "part"):
        if getattr(args, flag):
            raise ValueError(f"--{flag} is for models loaded here, not for --server")
    if args.batch is not None:
        raise ValueError("--batch is for models loaded here; a server batches its own requests: use --concurrency")
    _check_out(args, [*args.prompts])
    prompts = _prompts_from(args)
    summary = dump_server_trace(
        args.server,
        args.draft_server,
        prompts,
        args.out,
        settings=_settings(args),
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        top_k=args.top_logits,
        limit=args.limit,
        concurrency=args.concurrency,
        protocol=args.protocol,
        draft_protocol=args.draft_protocol,
        api_key_env=args.api_key_env,
        draft_api_key_env=args.draft_api_key_env or args.api_key_env,
        timeout=args.timeout,
        retries=args.retries,
        chat=args.prompt_format == "chat",
        tokenizer=prompt_ids_with(args.tokenizer) if args.tokenizer else None,
        vocab_size=args.vocab_size,
        shard_positions=args.shard_positions,
        progress=_progress(args),
    )
    print(
        f"wrote {summary.written_positions} positions to {args.out}"
        + (f" ({len(summary.refused)} sequence(s) refused as misaligned)" if summary.refused else "")
    )
    return 0


def run(args) -> int:
    from .._models._dump import dump_trace, load_completions

    if args.server or args.draft_server:
        if not args.server:
            raise ValueError("--draft-server needs --server: the verifier's server")
        return _run_servers(args)
    if not (args.verifier and args.draft):
        raise ValueError("give --verifier and --draft (models to load here), or --server and --draft-server")
    _check_out(args, [*args.prompts, args.completions, *_model_inputs(args)])
    check_model_arguments(args)
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
    summary = dump_trace(
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
        batch=args.batch,
        context=args.llama_context,
    )
    print(
        f"wrote {summary.written_positions} positions to {args.out}"
        + (f" (part {args.part[0]}/{args.part[1]})" if args.part else "")
    )
    return 0
