"""``cactus-theory conform``: the engine oracle. Its arguments, then the code that runs them."""

from __future__ import annotations

from ._common import (
    _check_out,
    _command_line,
    _count,
    _int_at_least,
    _model_options,
    _positive_float,
    _progress,
    _progress_options,
    _sampling_options,
    _settings,
    llama_options,
)

ORDER = 4.7
HELP = (
    "the engine oracle: does a serving engine's (or this package's) speculative sampling emit its rule's law? A "
    "p-value, the total variation with its interval, and the test's power"
)


def add_arguments(c):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    where = c.add_mutually_exclusive_group()
    where.add_argument("--server", default=None, help="a running llama-server started with --model-draft")
    where.add_argument("--verifier", default=None, help="or this package's decoders: the verifier (as decode takes it)")
    c.add_argument("--draft-server", default=None, help="a llama-server of the draft model alone (its rows)")
    c.add_argument("--draft", default=None, help="with --verifier: the draft model")
    c.add_argument("--rule", default="sampler-match", help="the rule the engine claims (llama-server: sampler-match)")
    c.add_argument(
        "--prompts", required=True, help="a prompt file (one a line, or JSON Lines): contexts chosen from it"
    )
    c.add_argument("--contexts", type=_int_at_least(1), default=20, help="contexts tested")
    c.add_argument("--samples", type=_count("samples"), default=1000, help="speculative samples per context")
    c.add_argument(
        "--tokens",
        type=_int_at_least(1, high=3),
        default=1,
        help="positions tested after those sampled before any draft (at most 3; 2 for a rule that is not lossless)",
    )
    c.add_argument("--forced", type=float, default=0.9, help="the mass a context's forced first token needs")
    c.add_argument("-m", type=_count("m"), default=4, help="with --verifier: drafts a step")
    c.add_argument("--batch", type=_count("batch"), default=1, help="with --verifier: samples decoded at once")
    c.add_argument("--seed", type=_int_at_least(0), default=0, help="the samples' seeds come from it")
    c.add_argument("--alpha", type=float, default=0.01, help="the test's level")
    c.add_argument(
        "--timeout", type=_positive_float, default=60.0, help="seconds a server may take to answer (a stall)"
    )
    c.add_argument("--out", default=None, help="the records (JSON Lines; a rerun resumes)")
    c.add_argument("--report", default=None, help="write conform.md / .json / .csv here")
    _model_options(c)
    _sampling_options(c)
    _progress_options(c)
    c.set_defaults(func=run)
    return c


def run(args) -> int:
    from .._data._prompts import load_prompts
    from .._oracle._decoder_engine import DecoderEngine
    from .._oracle._study import ConformanceStudy, choose_contexts
    from .._util._study import run_study

    if not (args.server or args.verifier):
        raise ValueError("give --server URL (a llama-server with a draft model) or --verifier and --draft")
    if args.verifier and not args.draft:
        raise ValueError("--verifier needs --draft: the oracle runs this package's speculative decoding")
    if not 0 < args.forced <= 1:
        raise ValueError(f"--forced must lie in (0, 1]; got {args.forced!r}")
    if not 0 < args.alpha < 1:
        raise ValueError(f"--alpha must lie in (0, 1); got {args.alpha!r}")
    _check_out(args, [args.prompts], directory=False)
    _check_out(args, [args.prompts], what="--report")  # before any sample is drawn
    prompts = load_prompts(args.prompts)
    settings = _settings(args)
    if args.server:
        from .._oracle._llama_server import LlamaServerEngine
        from .._servers._http import ServerClient
        from .._servers._protocol import make_protocol

        engine = LlamaServerEngine(args.server, settings=settings, draft_url=args.draft_server, timeout=args.timeout)
        speaker = make_protocol("llama.cpp", ServerClient(args.server, timeout=args.timeout, what="--server"))
        encoded = [(p.id, speaker.prompt_ids(p.text, chat=True)) for p in prompts]
    else:
        from .._models._decode_spec import DecodeSpec
        from .._models._hf import encode_chat, load_model

        opts = {"engine": args.engine, "dtype": args.dtype, "device": args.device, "progress": _progress(args)}
        if args.engine == "llama.cpp":
            opts.update(llama_options(args))
        verifier, draft = load_model(args.verifier, **opts), load_model(args.draft, **opts)
        spec = DecodeSpec(rule=args.rule, m=args.m, settings=settings, batch=args.batch)
        engine = DecoderEngine(verifier, draft, spec)
        encoded = [(p.id, encode_chat(verifier[1], p.text, f"prompt {p.id!r}")) for p in prompts]
    contexts, skipped = choose_contexts(engine, encoded, args.contexts, forced=args.forced)
    if not contexts:
        raise ValueError(
            f"--prompts: none of the {len(encoded)} prompts makes a context the oracle can test ("
            + "; ".join(f"{i}: {why}" for i, why in skipped[:3])
            + "): give other prompts or lower --forced"
        )
    print(f"engine: {engine.drafted}")
    print(f"contexts: {len(contexts)} ({', '.join(c.id for c in contexts)}); passed over {len(skipped)}")
    study = ConformanceStudy(engine, args.rule, contexts, samples=args.samples, tokens=args.tokens, seed=args.seed)
    records = run_study(study, out=args.out, progress=_progress(args))
    result = study.summarize(records, alpha=args.alpha)
    print(result.table())
    if args.report:
        for path in result.write(args.report, command=_command_line(args)):
            print(f"wrote {path}")
    return 0 if result.overall["p_value"] > args.alpha else 1
