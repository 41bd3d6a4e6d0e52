"""What the commands share: argument types that refuse bad values in one line, the option groups
several commands take, the output checks, and the parser's one-line errors."""

from __future__ import annotations

import argparse
import os

import numpy as np

from .._util._files import check_output, refuse_overlap


def _floats(text: str):
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers; got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("needs at least one number")
    return values


def _ints(text: str):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers; got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be integers >= 1; got {text!r}")
    return values


def _int_at_least(low, high=None):
    """An integer of at least ``low`` (and at most ``high``, where given): argparse names the flag on a refusal."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
        if value < low or (high is not None and value > high):
            within = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be an integer {within}; got {value}")
        return value

    parse.__name__ = f"integer >= {low}" if high is None else f"integer in [{low}, {high}]"
    return parse


def _count(name: str):
    """An argument type for the count ``name`` of ``RUN_LIMITS``: an integer from 1 to its bound."""
    from .._math._validation import RUN_LIMITS

    parse = _int_between(1, RUN_LIMITS[name])
    parse.__name__ = f"integer 1 to {RUN_LIMITS[name]:,}"
    return parse


def _int_between(low, high):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high:,}; got {value:,}")
        return value

    return parse


def _batches(text: str):
    """Comma-separated batch sizes, each from 1 to ``RUN_LIMITS['batch']``."""
    from .._math._validation import RUN_LIMITS

    values = _ints(text)
    if max(values) > RUN_LIMITS["batch"]:
        raise argparse.ArgumentTypeError(f"batch sizes must be from 1 to {RUN_LIMITS['batch']:,}; got {text!r}")
    return values


def _part(text: str):
    """I/N, 1 <= I <= N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be I/N, e.g. 2/4 (part 2 of 4); got {text!r}") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"must be I/N with 1 <= I <= N; got {text!r}")
    return i, n


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0 or np.isnan(value):
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1]; got {text}")
    return value


def _nonnegative(what, finite=False, hint=""):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} >= 0; got {text!r}") from None
        if np.isnan(value) or value < 0 or (finite and not np.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be {what} >= 0{' and finite' if finite else ''}; got {text}{hint}")
        return value

    parse.__name__ = f"{what} >= 0"
    return parse


_budget = _nonnegative("a divergence budget")


def _resamples(text: str) -> int:
    from .._math._bootstrap import MAX_RESAMPLES, MIN_RESAMPLES, check_resamples

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer number of resamples; got {text!r}") from None
    try:
        return check_resamples(value, "the resamples")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be 0 (no intervals) or {MIN_RESAMPLES:,} to {MAX_RESAMPLES:,} resamples (a 95% percentile interval "
            f"needs resamples in both 2.5% tails); got {value:,}"
        ) from None


def _command_line(args) -> str:
    """The command that reproduces this run, as the user typed it (``--plugin`` and data paths
    included), for the pages a command writes."""
    import shlex

    return "cactus-theory " + shlex.join(getattr(args, "command_line", None) or [])


#: The flags that set the sampling (``_sampling_options``), and the field of ``SamplingSettings`` each sets.
SAMPLING_FLAGS = {
    "--temperature": "temperature",
    "--top-k": "top_k",
    "--top-p": "top_p",
    "--min-p": "min_p",
    "--chain": "chain",
}


def _given_flags(args) -> list:
    """The options written on the command line (``--flag=value`` as ``--flag``), not those left at their default."""
    return [a.split("=")[0] for a in getattr(args, "command_line", None) or ()]


def _chain(args):
    """``--chain``: an engine's name, or a user's steps in order (comma-separated) as a tuple."""
    from .._math._sampling import DEFAULT_CHAIN

    chain = getattr(args, "chain", None) or DEFAULT_CHAIN
    return tuple(step.strip() for step in chain.split(",")) if "," in chain else chain


def _settings(args, records=None):
    """The SamplingSettings of the options ``_sampling_options`` adds. With ``records`` (the exact referee's, to
    be rescored): None where no sampling flag is written, else the records' own sampling with each flag written
    replacing its field (``--chain llama.cpp --min-p 0.05``: their temperature, top-k and top-p under llama.cpp's
    chain)."""
    import dataclasses

    from .._math._sampling import SamplingSettings

    fields = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": getattr(args, "min_p", 0.0),
        "chain": _chain(args),
    }
    try:
        if records is None:
            return SamplingSettings(**fields)
        given = [SAMPLING_FLAGS[flag] for flag in _given_flags(args) if flag in SAMPLING_FLAGS]
        if not given or not records:
            return None
        own = SamplingSettings.from_dict((records[0].get("setting") or {}).get("sampling"), "the records' sampling")
        return dataclasses.replace(own, **{name: fields[name] for name in given})
    except ValueError as exc:  # the settings' own words, with the flags that give them
        raise ValueError(f"--temperature / --top-k / --top-p / --min-p / --chain: {exc}") from None


def analysis_options(args, **more):
    """The ``AnalysisOptions`` of a command's arguments (the options it has; ``more``: what it computed
    itself, e.g. a cost model): built here alone, carried whole into ``analyze_trace``."""
    from .._analysis._options import AnalysisOptions

    found = {
        "ms": getattr(args, "m", None),
        "n_boot": getattr(args, "bootstrap", None),
        "processes": getattr(args, "processes", None),
        "bonus_policy": getattr(args, "bonus_policy", None),
        "tasks": getattr(args, "task", None),
        "draft_mode": getattr(args, "draft_mode", None),
        "gate": _gate(args) if getattr(args, "gate", None) is not None else None,
    }
    if getattr(args, "temperature", None) is not None:
        found["settings"] = _settings(args)
    return AnalysisOptions(**{k: v for k, v in {**found, **more}.items() if v is not None})


def decoding_spec(args, **more):
    """The ``DecodeSpec`` of ``decode``'s arguments (``more``: what it computed itself, e.g. the drafting
    policy and the gate): built and checked here alone, carried whole into ``decode_prompts``."""
    from .._models._decode_spec import DecodeSpec

    found = {
        "m": args.m,
        "settings": _settings(args),
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "baseline": args.baseline,
        "bonus_policy": args.bonus_policy,
        "draft_mode": args.draft_mode,
        "drift": args.drift,
        "batch": args.batch,
        "static_cache": getattr(args, "static_cache", False),
        "cuda_graphs": getattr(args, "cuda_graphs", False),
        "fuse_rule": getattr(args, "fuse_rule", False),
    }
    return DecodeSpec(**{**found, **more})


def _check_out(args, inputs, *, directory=True, what="--out"):
    """The output the flag ``what`` names (``args.out`` for --out, ``args.report`` for --report), when given, can be
    written, and is none of the command's ``inputs`` nor inside one (trace directories, prompt and cost files, model
    files): checked before any work."""
    out = getattr(args, what.lstrip("-").replace("-", "_"), None)
    if out is None:
        return None
    path = check_output(out, directory=directory, what=what)
    refuse_overlap(out, [x for x in inputs if x], what=what)
    return path


def _trace_inputs(args):
    """The paths the positional trace arguments name (globs expanded), for ``_check_out``."""
    import glob

    out = []
    for item in getattr(args, "trace", None) or []:
        out.extend(glob.glob(item) if glob.has_magic(item) else [item])
    return out


def _model_inputs(args):
    return [
        x
        for x in (getattr(args, "verifier", None), getattr(args, "draft", None))
        if x and x != "ngram" and os.path.exists(os.path.expanduser(x))
    ]


def _traces(args):
    """The trace set of the positional trace arguments (default: the embedded trace; with --task
    naming a task it lacks, such as Spec-Bench's translation, the embedded trace set)."""
    from .._data._traceset import embedded_traces, open_traces

    return open_traces(args.trace) if args.trace else embedded_traces(getattr(args, "task", None))


def _analysed(traces, result) -> str:
    """The header line of what an analysis read: the sequences and positions analysed (those of the
    tasks asked for), and the trace's totals when they differ."""
    n = len(result.sequences) + result.empty_sequences
    positions = sum(s.positions for s in result.sequences)
    line = f"{n} sequences, {positions} positions analysed"
    if n != len(traces) or positions != traces.n_positions:
        line += f" (of the trace's {len(traces)} sequences, {traces.n_positions} positions)"
    return line


def _trace_argument(parser, help="trace directories or globs (default: the embedded trace)"):
    """The positional traces of a command over traces (``_traces`` reads them)."""
    parser.add_argument("trace", nargs="*", default=None, help=help)


def _study_options(parser, writes, out_default=None):
    """The options every study of a trace takes: the traces, --bootstrap, --out (``writes``: the
    files it writes there) and the progress switches."""
    _trace_argument(parser)
    parser.add_argument("--bootstrap", type=_resamples, default=1000, help="bootstrap resamples (0: no intervals)")
    parser.add_argument("--out", default=out_default, help=f"write {writes} here")
    _progress_options(parser)


def _run_study(args, study, show=None, **options) -> int:
    """A study command's run: --out checked before the work, ``study(traces, **options, progress=...)``
    on the traces, its tables printed (``show(result)``, default its ``table()``) and its files
    written."""
    _check_out(args, _trace_inputs(args))
    result = study(_traces(args), **options, progress=_progress(args))
    if show is None:
        print(result.table())
    else:
        show(result)
    _write_result(args, result)
    return 0


def _write_result(args, result) -> None:
    """A study's result written into --out (its pages headed by the command), the paths printed."""
    if args.out:
        for path in result.write(args.out, command=_command_line(args)):
            print(f"wrote {path}")


def _tasks_to_show(rows):
    """The tasks whose tables are printed: each task, and 'all' before them when there are several."""
    tasks = sorted({r["task"] for r in rows} - {"all"})
    return ["all", *tasks] if len(tasks) > 1 else tasks


def _progress(args):
    """--progress forces the bars, --quiet silences them; otherwise only on a terminal."""
    return False if getattr(args, "quiet", False) else (True if getattr(args, "progress", False) else None)


def _prompts_from(args):
    from .._data._prompts import load_prompts

    prompts = []
    for path in args.prompts:
        prompts.extend(
            load_prompts(
                path,
                dataset=args.dataset,
                limit=args.per_file,
                field=args.field,
                task=args.task,
                task_field=args.task_field,
                id_field=None if args.id_field.lower() == "none" else args.id_field,
            )
        )
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError("two prompt files give the same prompt ids: label them with --task, one run per task")
    if not prompts:
        raise ValueError(f"no prompts in {', '.join(args.prompts)}")
    return prompts


def _rules_epilog() -> str:
    from .._rules import available_rules

    names = ", ".join(available_rules())
    return (
        "Rules are spec strings 'name(key=value, ...)', comma-separated, e.g.\n"
        "  'sps,cactus(delta=1),rfsd(divergence=js, threshold=0.2)';\n"
        "a rule with a delta it does not set is built once per --delta value.\n"
        f"Registered: {names}.\n'cactus-theory rules' lists their parameters and defaults."
    )


def _delta_help() -> str:
    from .._rules import available_rules

    takers = [
        name
        for name, info in available_rules().items()
        if "delta" in info.rule_class.grid_parameters and "delta" in info.parameters
    ]
    return (
        f"divergence budgets of the rules that take one and set none ({', '.join(takers)}); other rules "
        "keep their own parameters"
    )


class _Parser(argparse.ArgumentParser):
    """argparse with one line per refusal: 'cactus-theory CMD: error: ... (cactus-theory CMD --help)',
    exit 2, instead of the usage block and the error; and no flag taken by an abbreviation (``--temp`` is refused,
    never read as ``--temperature``: what a command reads as written is what argparse parsed)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        first = " ".join(str(message).split())
        if len(first) > 600:
            first = first[:600] + "..."
        self.exit(2, f"{self.prog}: error: {first} (see {self.prog} --help)\n")


class _CombinedSpecs(argparse.Action):
    """A list of comma-separated specs that a repeated option extends instead of replacing:
    ``--rules sps --rules tas`` is ``--rules sps,tas`` (the default only when never given)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "_given_" + self.dest, False)
        text = str(values).strip()
        setattr(namespace, self.dest, f"{getattr(namespace, self.dest)},{text}" if given else text)
        setattr(namespace, "_given_" + self.dest, True)


def _rules_option(parser, default="sps,tas,cactus,cactus-exact,mentored"):
    parser.add_argument(
        "--rules",
        default=default,
        action=_CombinedSpecs,
        help="rule specs (see below); repeated, the lists are combined",
    )


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in every option's help (but not an absent one: None or a flag's False), and
    epilogs as written."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _progress_options(parser):
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quiet", action="store_true", help="no progress bars")
    group.add_argument("--progress", action="store_true", help="progress bars even when stderr is not a terminal")


def _sampling_options(parser, temperature=0.6):
    parser.add_argument("--temperature", type=float, default=temperature, help="sampling temperature (0 = greedy)")
    parser.add_argument("--top-k", type=_int_at_least(0), default=20, help="top-k of both models (0 = off)")
    parser.add_argument("--top-p", type=float, default=0.95, help="top-p of both models (1 = off)")
    parser.add_argument(
        "--min-p", type=float, default=0.0, help="min-p of both models (0 = off; llama.cpp's own is 0.05)"
    )
    parser.add_argument(
        "--chain",
        default=None,
        metavar="ENGINE|STEPS",
        help="the sampler chain that applies them, as the engine you deploy on does: vllm (default: temperature, "
        "min-p, top-k, top-p), hf, sglang, llama.cpp (top-k, top-p and min-p untempered, temperature last), or "
        "your steps in order, comma-separated (temperature,top_k,top_k_exact,top_p,min_p)",
    )


def _draft_mode_option(parser):
    parser.add_argument(
        "--draft-mode",
        choices=("sampled", "greedy"),
        default="sampled",
        help="how the drafter drafts: sampled from p, or greedy (argmax p, one-hot for the rule: MTP heads, EAGLE)",
    )


def _gate_option(parser):
    parser.add_argument(
        "--gate",
        default=None,
        metavar="OPEN:CLOSE[:inside]",
        help="gated relaxation: relaxed rules judge only inside regions opened by token id OPEN and closed by CLOSE "
        "(several ids joined by ';'; ':inside' if the output starts inside, e.g. after a prompt ending in <think>), "
        "SpS elsewhere; lossless rules are not gated",
    )


def _gate(args):
    """The gate of ``--gate`` (None without one); a bad one is a ValueError naming the option."""
    from .._laws._gate import make_gate

    try:
        return make_gate(args.gate)
    except ValueError as exc:
        raise ValueError(f"--gate: {exc}") from None


def _bonus_policy_option(parser):
    from .._rules import BONUS_POLICIES

    parser.add_argument(
        "--bonus-policy",
        choices=BONUS_POLICIES,
        default="verifier",
        help="bonus token after m accepted drafts: from q (verifier) or one more step of the rule (relaxed)",
    )


#: What loading a model pair costs, for the commands that load one.
MODEL_MEMORY = """\
Models: on --engine hf a GGUF file is dequantised on its first load (about 45 s per billion
parameters on 2 cores, several minutes on a busy machine; a message says so) and cached; later
loads take seconds. Memory: the Qwen2.5-Coder 1.5B + 0.5B pair peaks at 9-11 GB during dump,
calibrate and decode (float32 weights of both models and transformers' load); bfloat16 halves
the weights once loaded. On --engine llama.cpp the GGUF file runs as stored: loads in seconds,
the pair in about 3 GB (docs/results/llama-cpp-against-hugging-face.md has the measured ratios)."""


def llama_options(args) -> dict:
    """The llama.cpp options a command's flags give (``--context``), for ``load_model``."""
    return {"context": args.llama_context} if getattr(args, "llama_context", None) is not None else {}


def _model_options(parser, *, context=True):
    parser.add_argument(
        "--engine",
        default="hf",
        choices=("hf", "llama.cpp"),
        help="hf: transformers (any checkpoint; a GGUF file dequantised); llama.cpp: GGUF files run by llama.cpp's "
        "quantised kernels (pip install -e '.[llamacpp]'; --dtype and --no-model-cache do not apply)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (checked before any model loads)")
    if context:
        parser.add_argument(
            "--context",
            dest="llama_context",
            metavar="TOKENS",
            type=_int_at_least(8),
            default=None,
            help="--engine llama.cpp: the tokens each sequence's context holds, a prompt and its continuation "
            "(default 2048; at most the model's own limit)",
        )
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("float32", "bfloat16", "float16"),
        help="model dtype (float32: twice the memory, the exact reference)",
    )
    parser.add_argument(
        "--no-model-cache",
        action="store_true",
        help="dequantise GGUF files on every load instead of caching the weights (in $CACTUS_THEORY_CACHE or "
        "~/.cache/cactus_theory)",
    )


def _prompt_file_options(parser, group=None):
    """--prompts (required, or in ``group``, e.g. beside --prompt) and the options that read them."""
    from .._data._prompts import datasets

    (group or parser).add_argument(
        "--prompts", nargs="+", required=group is None, default=None, help="prompt files (formats below)"
    )
    parser.add_argument(
        "--dataset", choices=datasets(), default=None, help="read the files as this benchmark, with its instruction"
    )
    parser.add_argument("--field", default=None, help="JSON key or CSV column of the prompt text")
    parser.add_argument(
        "--task",
        default=None,
        help="task label of every prompt (default: each record's --task-field, else the file's name)",
    )
    parser.add_argument(
        "--task-field",
        default="task",
        help="JSON key or CSV column with a record's own task label (used where present)",
    )
    parser.add_argument(
        "--id-field",
        default="id",
        help="JSON key or CSV column with a record's own id: prompt ids are TASK-ID where present, else TASK-INDEX "
        "('none': always TASK-INDEX)",
    )
    parser.add_argument("--per-file", type=_int_at_least(0), default=None, help="first N prompts of each file")


def _pair_or_servers(parser, title, description, server_help):
    """--verifier / --draft (models loaded here) and, in a group of their own, --server / --draft-server /
    --api-key-env (models already running behind HTTP servers); returns that group for more options."""
    parser.add_argument("--verifier", default=None, help="verifier: Hugging Face id, local directory or .gguf file")
    parser.add_argument("--draft", default=None, help="draft model: Hugging Face id, local directory or .gguf file")
    group = parser.add_argument_group(title, description)
    group.add_argument("--server", default=None, metavar="URL", help=server_help)
    group.add_argument("--draft-server", default=None, metavar="URL", help="the draft model's server")
    group.add_argument("--api-key-env", default=None, metavar="NAME", help="environment variable holding the API key")
    return group


def _positive_float(text):
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def check_model_arguments(args) -> None:
    """What can be refused before a model loads: a ``--device`` this machine lacks (torch's own message
    would come only after the weights load)."""
    if getattr(args, "llama_context", None) is not None and getattr(args, "engine", "hf") != "llama.cpp":
        raise ValueError("--context sizes llama.cpp's context: it applies with --engine llama.cpp only")
    if getattr(args, "device", None) is not None and getattr(args, "engine", "hf") in ("hf", "llama.cpp"):
        from .._models._hf import check_device

        check_device(args.device, "--device")
