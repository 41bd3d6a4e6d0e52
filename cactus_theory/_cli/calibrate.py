"""``cactus-theory calibrate``: time a model pair's forward passes on this machine.
Its arguments, then the code that runs them."""

from __future__ import annotations

from .._util._files import check_output
from ._common import (
    MODEL_MEMORY,
    _batches,
    _check_out,
    _int_at_least,
    _ints,
    _model_inputs,
    _model_options,
    _pair_or_servers,
    _positive_float,
    _progress,
    _progress_options,
    _sampling_options,
    _settings,
    check_model_arguments,
)

ORDER = 5
HELP = "time a model pair's forward passes on this machine: a cost file for 'plan'"
EPILOG = MODEL_MEMORY


def add_arguments(cb):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    group = _pair_or_servers(
        cb,
        "against running servers (instead of --verifier / --draft)",
        "llama-server's own step times over HTTP: the verifier's per token and per block of k new tokens, the "
        "draft's per token and per token read in a block, each server's prompt processing (docs: Traces from servers)",
        "the verifier's llama-server",
    )
    group.add_argument(
        "--timeout", type=_positive_float, default=600.0, help="seconds a request to a server may take in all"
    )
    group.add_argument("--retries", type=_int_at_least(0), default=4, help="retries on 429 / 503 / dropped connections")
    _model_options(cb, context=False)  # its own --context: the tokens cached while timing
    _sampling_options(cb)
    cb.add_argument(
        "--max-block",
        type=_int_at_least(1),
        default=21,
        help="largest verifier block timed (m + 1; k m + 1 for a tree of width k)",
    )
    cb.add_argument("--context", type=_int_at_least(1), default=256, help="tokens in the KV caches while timing")
    cb.add_argument("--repeats", type=_int_at_least(1), default=5, help="timings per part (median)")
    cb.add_argument(
        "--prompt-lengths",
        type=_ints,
        default=[32, 128, 512],
        help="prompt lengths whose processing is timed per model (whole-request cost)",
    )
    cb.add_argument(
        "--second-context",
        type=_int_at_least(2),
        default=None,
        help="a longer context for the context slope (default: 2 x --context)",
    )
    cb.add_argument(
        "--batch",
        type=_batches,
        default=[1],
        help="batch sizes whose step parts are timed too, e.g. 1,2,4 (either engine): 'plan --batch' then "
        "predicts throughput at each",
    )
    cb.add_argument(
        "--out", default=None, help="cost file (default: in the user cache, named by models, dtype, device)"
    )
    _progress_options(cb)
    cb.set_defaults(func=run)
    return cb


def _run_servers(args) -> int:
    from .._analysis._calibrations import default_cost_path
    from .._servers._calibrate import calibrate_server

    if args.verifier or args.draft:
        raise ValueError("give either --server / --draft-server or --verifier / --draft, not both")
    if not (args.server and args.draft_server):
        raise ValueError("--server and --draft-server both: the verifier's llama-server and the draft model's")
    out = args.out
    if out is not None:
        _check_out(args, [], directory=False)
    cost = calibrate_server(
        args.server,
        args.draft_server,
        batches=sorted({1, *args.batch}),
        max_block=args.max_block,
        context=args.context,
        repeats=args.repeats,
        prompt_lengths=args.prompt_lengths,
        api_key_env=args.api_key_env,
        timeout=args.timeout,
        retries=args.retries,
        progress=_progress(args),
    )
    if out is None:
        names = [str(cost.source[r].get("model") or "server").rsplit("/", 1)[-1] for r in ("verifier", "draft")]
        out = check_output(default_cost_path(names[0], names[1], "server", "http"), directory=False)
    cost.save(out)
    print(
        f"verifier step {cost.verify_block[1] * 1e3:.1f} ms, block of {max(cost.verify_block)} "
        f"{cost.verify_block[max(cost.verify_block)] * 1e3:.1f} ms; draft step {cost.draft_token * 1e3:.1f} ms, a "
        f"token read in a block {cost.draft_read_token * 1e3:.2f} ms (the servers' own timings)"
    )
    return _finish(cost, out)


def _finish(cost, out) -> int:
    """The per-batch lines, the cost model's problems and where it went."""
    blocks = cost.verify_block
    top = max(blocks)
    for size, entry in cost.batch.items():
        b1, bt = entry["verify_block"][1], entry["verify_block"][top]
        print(
            f"batch {size}: a draft step {entry['draft_token'] * 1e3:.1f} ms, a verifier step {b1 * 1e3:.1f} ms "
            f"({b1 / blocks[1]:.2f}x batch 1), of {top} tokens each {bt * 1e3:.1f} ms"
        )
    for problem in cost.problems():
        print(f"warning: {problem}")
    print(f"wrote {out}")
    return 0


def run(args) -> int:
    from .._analysis._calibrations import default_cost_path
    from .._models._calibrate import calibrate_cost
    from .._models._hf import load_model

    if args.server or args.draft_server:
        return _run_servers(args)
    if not (args.verifier and args.draft):
        raise ValueError("give --verifier and --draft (models to load here), or --server and --draft-server")
    progress = _progress(args)
    _check_out(args, _model_inputs(args), directory=False)
    check_model_arguments(args)
    opts = {"cache": not args.no_model_cache, "progress": progress, "engine": args.engine}
    if args.engine == "llama.cpp":  # the caches the timings hold at once, and a batch's sequences
        opts["sequences"] = max(args.batch) + 4
    verifier = load_model(args.verifier, args.device, args.dtype, **opts)
    draft = load_model(args.draft, args.device, args.dtype, **opts)
    dtype = args.dtype if args.engine == "hf" else "llamacpp"  # llama.cpp runs the weights as stored
    out = args.out or check_output(
        default_cost_path(verifier[2]["name"], draft[2]["name"], dtype, args.device), directory=False
    )  # the default is known only once the models are: checked before the timing
    cost = calibrate_cost(
        verifier,
        draft,
        max_block=args.max_block,
        context=args.context,
        repeats=args.repeats,
        settings=_settings(args),
        progress=progress,
        prompt_lengths=args.prompt_lengths,
        second_context=args.second_context,
        batch=args.batch,
    )
    cost.save(out)
    blocks = cost.verify_block
    top = max(blocks)
    print(
        f"draft token {cost.draft_token * 1e3:.1f} ms; verifier block of 1: {blocks[1] * 1e3:.1f} ms, of {top}: "
        f"{blocks[top] * 1e3:.1f} ms ({blocks[top] / blocks[1]:.2f}x one token); step overhead "
        f"{cost.step_overhead * 1e3:.2f} ms (the decoding loop's, from whole steps); judging a token "
        f"{cost.judge_token * 1e3:.2f} ms; the verifier alone's loop {cost.alone_overhead * 1e3:.2f} ms a token "
        "beyond its forward"
    )
    print(f"draft / verifier cost ratio: {cost.draft_token / blocks[1]:.3f}")
    for name, per in cost.prefill.items():
        print(f"{name} prefill: " + ", ".join(f"{n} tokens {s:.2f} s" for n, s in per.items()))
    print(
        f"context slope per 1,000 tokens: verify {cost.context_slope['verify'] * 1e6:.1f} ms, draft "
        f"{cost.context_slope['draft'] * 1e6:.1f} ms"
    )
    return _finish(cost, out)
