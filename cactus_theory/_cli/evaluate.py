"""``cactus-theory evaluate``: the quality referee. Its arguments, then the code that runs them."""

from __future__ import annotations

import os

from ._common import (
    MODEL_MEMORY,
    _CombinedSpecs,
    _count,
    _int_at_least,
    _model_inputs,
    _model_options,
    _progress,
    _progress_options,
    _resamples,
    _rules_epilog,
    _sampling_options,
    _settings,
    llama_options,
)

ORDER = 4.5
HELP = "the quality referee: accuracy of rules against the verifier alone on a graded benchmark, paired"


def _epilog() -> str:
    return _rules_epilog() + "\n\n" + MODEL_MEMORY


#: The --help epilog, made as the parser is built (after the plugins: their rules listed).
EPILOG = _epilog
#: The library's settings as this command's flags (its refusals say them so).
FLAGS = {"drift": "the drift record (on unless --no-drift)"}


def add_arguments(e):
    """This command's arguments (``_main`` makes its subparser: its name, ``HELP``, ``EPILOG``)."""
    from .._data._graders import graded_benchmarks

    e.add_argument("--verifier", default=None, help="verifier: Hugging Face id, local directory or .gguf file")
    e.add_argument("--draft", default=None, help="draft model (as --verifier)")
    e.add_argument(
        "--rule",
        default=None,
        action=_CombinedSpecs,
        help="rule spec(s), repeatable; the verifier alone is always decoded too (the reference)",
    )
    e.add_argument("--benchmark", choices=graded_benchmarks(), default="gsm8k", help="the graded benchmark")
    e.add_argument("--data", default=None, help="the benchmark directory (default: the data directory variable)")
    e.add_argument(
        "--file",
        default=None,
        help="a benchmark file instead (any file of its records; 'choice': JSON Lines with question, choices, answer)",
    )
    e.add_argument("--limit", type=_int_at_least(1), default=20, help="problems (from the first)")
    e.add_argument("--start", type=_int_at_least(0), default=0, help="the first problem's index in the file")
    e.add_argument("--samples", type=_count("samples"), default=1, help="samples per problem and method")
    e.add_argument("-m", type=_count("m"), default=8, help="drafted tokens per verification")
    e.add_argument("--batch", type=_count("batch"), default=1, help="problems decoded at once")
    e.add_argument("--max-new-tokens", type=_count("max_new_tokens"), default=512, help="tokens an answer may have")
    e.add_argument(
        "--allow-code-execution",
        action="store_true",
        help="run the programs the models write (HumanEval, MBPP), isolated by the operating system; without it "
        "(or CACTUS_ALLOW_CODE_EXECUTION=1) those benchmarks are refused before decoding",
    )
    e.add_argument(
        "--seed",
        type=_int_at_least(0),
        default=0,
        help="each answer's seed comes from it, the problem, the method and the sample",
    )
    e.add_argument(
        "--no-drift", action="store_true", help="do not record each token's KL (faster; needed for block rules)"
    )
    e.add_argument(
        "--out",
        default=None,
        help="JSON Lines of records (appended; a rerun resumes); with --rescore a new file (NAME.jsonl.gz: compressed)",
    )
    e.add_argument(
        "--summarize", default=None, metavar="RECORDS", help="only summarise a records file (either kind; no model)"
    )
    e.add_argument(
        "--rescore",
        default=None,
        metavar="RECORDS",
        help="score --rule again from records, no model: an exact referee's (their answer rows: any token rule or "
        "grid, under the records' sampling or the chain given: --chain, --temperature, ...; --out writes the records), "
        "or sampled answers kept with --rows (every decoded method and each --rule at the records' m, or at -m if "
        "written, from one pool weighted by exact likelihoods; --out writes the rows)",
    )
    e.add_argument(
        "--exact",
        action="store_true",
        help="the exact expected accuracy where one token decides (a multiple-choice benchmark asked at the answer "
        "position: choice, arc_challenge): each method's law of the answer token, no sampling",
    )
    e.add_argument(
        "--threads",
        type=_int_at_least(1),
        default=None,
        help="CPU threads of the forwards (default: the CPUs this process may use, said in the progress line)",
    )
    e.add_argument(
        "--scheduler",
        default=None,
        metavar="tcp://HOST:PORT",
        help="spread the problems over this Dask cluster's workers (each loads the pair once; --verifier and --draft "
        "are paths the workers can read)",
    )
    e.add_argument(
        "--rows",
        type=_int_at_least(0),
        default=0,
        help="keep both models' largest N logits at every position of each answer (teacher-forced after it), so "
        "--rescore estimates any token rule at any m from the answers without a model (0: none; 20 holds top-k 20)",
    )
    e.add_argument(
        "--min-ess",
        type=float,
        default=1.0,
        help="--rescore on answers with rows: effective answers a problem below which a rule's pooled estimate is "
        "not used (its own answers where it was decoded)",
    )
    e.add_argument("--bootstrap", type=_resamples, default=2000, help="resamples of the paired intervals")
    _model_options(e)
    _sampling_options(e)
    _progress_options(e)
    e.set_defaults(func=run)
    return e


def run(args) -> int:

    from .._analysis._referee_summary import (
        quality_markdown,
        read_exact_records,
        read_records,
        summarize_exact,
        summarize_records,
    )
    from .._studies._exact_choice import KIND as EXACT
    from .._studies._exact_choice import ExactReferee
    from .._studies._quality import SampledReferee
    from .._util._study import run_study

    if args.rescore:
        return _rescore(args)
    if args.summarize:
        if args.verifier or args.draft or args.rule:
            raise ValueError("--summarize reads a records file alone: drop --verifier, --draft and --rule")
        if _first_kind(args.summarize) == EXACT:
            print(summarize_exact(read_exact_records(args.summarize), n_boot=args.bootstrap, seed=args.seed).table())
        else:
            summary = summarize_records(read_records(args.summarize), n_boot=args.bootstrap, seed=args.seed)
            print(quality_markdown(summary))
        return 0
    if not (args.verifier and args.draft and args.rule):
        raise ValueError("give --verifier, --draft and at least one --rule (or --summarize RECORDS)")
    from .._analysis._analyze import parse_rules
    from .._data._benchmarks import get_benchmark
    from .._data._graders import load_problems, require_code_execution
    from .._models._hf import load_model
    from ._common import _check_out, check_model_arguments

    require_code_execution(args.benchmark, args.allow_code_execution or None, flag="--allow-code-execution")
    if get_benchmark(args.benchmark).runs_code:
        from .._util._sandbox import _isolation_decision

        _isolation_decision(None)  # no isolation here (and no knowing consent): refused before any model loads
    _check_out(args, [args.file, *_model_inputs(args)], directory=False)
    check_model_arguments(args)
    rules = parse_rules(args.rule, [1.0])
    if args.exact and not get_benchmark(args.benchmark).one_token:
        raise ValueError(
            f"--exact needs a benchmark where one token decides (a multiple-choice one: choice, arc_challenge); "
            f"{args.benchmark} is graded by sampling: drop --exact"
        )
    problems = load_problems(args.benchmark, args.data, path=args.file, limit=args.limit, start=args.start)
    if not args.exact:  # each rule's decoding settings checked before any model loads
        from .._models._decode_spec import DecodeSpec

        spec = DecodeSpec(
            m=args.m, settings=_settings(args), max_new_tokens=args.max_new_tokens, drift=not args.no_drift
        )
        for rule in rules:
            spec.with_rule(rule)
        if args.rows and not spec.settings.support_within(args.rows):
            raise ValueError(
                f"--rows {args.rows}: that many logits a position cannot hold the law of the sampling "
                f"({spec.settings.describe()}): give --rows of at least its top-k ({spec.settings.top_k or 'none set'})"
            )
    opts = {"device": args.device, "dtype": args.dtype, "cache": not args.no_model_cache, "engine": args.engine}
    if args.engine == "llama.cpp":
        opts["sequences"] = 1 if args.exact else args.batch
        opts.update(llama_options(args))
    client = None
    if args.scheduler:  # the workers load the pair from its paths, once each
        from .._analysis._engines import connect_scheduler

        client = connect_scheduler(args.scheduler)
        pair, load = (args.verifier, args.draft), opts
    else:
        verifier = load_model(args.verifier, progress=_progress(args), **opts)
        pair, load = (verifier, load_model(args.draft, progress=_progress(args), **opts)), None
    if args.exact:
        study = ExactReferee(*pair, problems, rules, settings=_settings(args), threads=args.threads, load_options=load)
    else:
        study = SampledReferee(
            *pair,
            problems,
            rules,
            m=args.m,
            settings=_settings(args),
            max_new_tokens=args.max_new_tokens,
            samples=args.samples,
            seed=args.seed,
            batch=args.batch,
            drift=not args.no_drift,
            allow_code_execution=args.allow_code_execution or None,
            threads=args.threads,
            load_options=load,
            rows=args.rows,
        )
    try:
        records = run_study(study, out=args.out, progress=_progress(args), client=client)
    finally:
        if client is not None:
            from .._analysis._engines import close_quietly

            close_quietly(client)
    print(study.summarize(records, n_boot=args.bootstrap, seed=args.seed).table())
    if args.out:
        print(f"records in {args.out}")
    return 0


def _first_kind(path):
    """The ``record`` field of a records file's first record (None where it has none)."""
    from .._util._files import json_lines

    for _, rec in json_lines(path, "a record of cactus-theory evaluate"):
        return rec.get("record") if isinstance(rec, dict) else None
    return None


def _rescore(args) -> int:
    """``--rescore RECORDS``: the exact referee's records of ``--rule`` scored again from the answer rows alone."""
    from .._analysis._analyze import parse_rules
    from .._analysis._referee_summary import EXACT_KIND, read_exact_records, summarize_exact
    from .._analysis._rescore import rescore_exact
    from .._util._files import write_records
    from ._common import _check_out

    if args.verifier or args.draft or args.summarize or args.exact:
        raise ValueError("--rescore reads a records file alone: drop --verifier, --draft, --exact and --summarize")
    if not args.rule and _first_kind(args.rescore) == EXACT_KIND:
        raise ValueError("--rescore needs at least one --rule to score (several: 'cactus(delta=0.5),lossy(alpha=0.3)')")
    _check_out(args, [args.rescore], directory=False)
    if args.out and os.path.lexists(args.out):  # a file this command did not make is never replaced
        raise ValueError(
            f"--out {args.out!r} exists: the rescored records go to a new file (NAME.jsonl, or NAME.jsonl.gz "
            "compressed); give another name, or remove that file"
        )
    if _first_kind(args.rescore) != EXACT_KIND:
        return _rescore_pool(args)
    held = read_exact_records(args.rescore)
    records = rescore_exact(held, parse_rules(args.rule, [1.0]), settings=_settings(args, held))
    print(summarize_exact(records, n_boot=args.bootstrap, seed=args.seed).table())
    if args.out:
        print(f"records in {write_records(records, args.out)}")
    return 0


def _rescore_pool(args) -> int:
    """``--rescore RECORDS`` on the sampled referee's answers kept with rows: the pooled estimate of every decoded
    method and each ``--rule`` (``pooled_from_records``)."""
    from .._analysis._analyze import parse_rules
    from .._analysis._pooled import pooled_from_records, pooled_table
    from .._analysis._referee_summary import read_records
    from .._util._files import write_records
    from ._common import _given_flags

    if not args.min_ess > 0:
        raise ValueError(f"--min-ess must be a number > 0 (effective answers a problem); got {args.min_ess}")
    held = read_records(args.rescore)
    rules = parse_rules(args.rule, [1.0]) if args.rule else []
    ms = [args.m] if "-m" in _given_flags(args) else None
    sampling = _settings(args, held)
    rows = pooled_from_records(
        held, rules, ms=ms, settings=sampling, n_boot=args.bootstrap, seed=args.seed, min_ess=args.min_ess
    )
    print(pooled_table(rows))
    if args.out:
        print(f"rows in {write_records(rows, args.out)}")
    return 0
