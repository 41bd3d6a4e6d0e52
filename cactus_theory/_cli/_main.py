"""Command-line interface: ``cactus-theory`` / ``python -m cactus_theory``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .._analysis._plan import DEFAULT_COST_PROFILE
from .._math._divergences import available_divergences, binary_divergence, get_divergence
from .._math._gamma import APPROX_METHODS, approx_gamma, exact_gamma
from .._util._files import check_output, refuse_overlap

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


def _int_at_least(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}; got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


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


_resamples.__name__ = "resamples"


def _settings(args):
    """The SamplingSettings of the options ``_sampling_options`` adds."""
    from .._math._sampling import SamplingSettings

    return SamplingSettings(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def _check_out(args, inputs, *, directory=True, what="--out"):
    """``args.out`` (when given) can be written, and is none of the command's ``inputs`` nor inside
    one (trace directories, prompt and cost files, model files): checked before any work."""
    out = getattr(args, "out", None)
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
    return [x for x in (getattr(args, "verifier", None), getattr(args, "draft", None)) if x and x != "ngram" and
            os.path.exists(os.path.expanduser(x))]  # fmt: skip


def _traces(args):
    """The trace set of the positional trace arguments (default: the embedded trace)."""
    from .._data._trace import load_trace
    from .._data._traceset import open_traces

    return open_traces(args.trace) if args.trace else open_traces(load_trace())


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
        prompts.extend(load_prompts(path, dataset=args.dataset, limit=args.per_file, field=args.field, task=args.task,
                                    task_field=args.task_field))  # fmt: skip
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError("two prompt files give the same prompt ids: label them with --task, one run per task")
    if not prompts:
        raise ValueError(f"no prompts in {', '.join(args.prompts)}")
    return prompts


def _cmd_dump(args) -> int:
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
    )
    print(f"wrote {n} positions to {args.out}" + (f" (part {args.part[0]}/{args.part[1]})" if args.part else ""))
    return 0


def _dask_client(args):
    """(client, cluster) for --scheduler / --workers, or (None, None)."""
    if args.scheduler is None and args.workers is None:
        return None, None
    if args.processes > 1:
        raise ValueError("--processes runs local worker processes: give it or --scheduler / --workers, not both")
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ImportError("--scheduler and --workers need Dask: pip install 'cactus_theory[distributed]'") from None
    from .._analysis._engines import connect_scheduler, local_dask_cluster

    if args.scheduler is not None:
        return connect_scheduler(args.scheduler), None
    return local_dask_cluster(args.workers)


def _cmd_analyze(args) -> int:
    from .._analysis._analyze import analyze_trace, parse_rules
    from .._analysis._outputs import write_outputs

    _check_out(args, _trace_inputs(args))
    traces = _traces(args)
    settings = _settings(args) if args.temperature is not None else None
    rules = parse_rules(args.rules, args.delta)
    client, cluster = _dask_client(args)
    try:
        result = analyze_trace(
            traces,
            rules,
            ms=args.m,
            settings=settings,
            n_boot=args.bootstrap,
            processes=args.processes,
            progress=_progress(args),
            bonus_policy=args.bonus_policy,
            tasks=args.task,
            client=client,
            draft_mode=args.draft_mode,
        )
    finally:
        from .._analysis._engines import close_quietly

        close_quietly(client, cluster)
    where = traces.directory if len(traces.traces) == 1 else f"{len(traces.traces)} traces ({traces.directory})"
    drafts = "" if args.draft_mode == "sampled" else "; greedy drafting (argmax p, one-hot for the rules)"
    print(f"trace {where}: {len(traces)} sequences, {traces.n_positions} positions; settings {result.settings}{drafts}")
    if result.empty_sequences:
        print(f"{result.empty_sequences} sequence(s) without positions left out")
    for note in result.notes:
        print(f"note: {note}")
    if any(r["sequences"] < 2 for r in result.rows):
        print("a 95% interval needs at least two sequences: rows over one sequence have none")
    for task in _tasks_to_show(result.rows):
        label = "all tasks" if task == "all" else f"task {task}"
        positions = next(r["positions"] for r in result.rows if r["task"] == task)
        print(f"\n{label} ({positions} positions)")
        print(result.table(task))
    for name in result.traces if result.trace_rows else []:
        positions = next(r["positions"] for r in result.trace_rows if r["trace"] == name)
        print(f"\ntrace {name} ({positions} positions)")
        print(result.table(trace=name))
    if args.out:
        for path in write_outputs(result, args.out, figures=not args.no_figures):
            print(f"wrote {path}")
    return 0


def _cmd_calibrate(args) -> int:
    from .._analysis._plan import default_cost_path
    from .._models._calibrate import calibrate_cost
    from .._models._hf import load_model

    progress = _progress(args)
    _check_out(args, _model_inputs(args), directory=False)
    verifier = load_model(args.verifier, args.device, args.dtype, cache=not args.no_model_cache, progress=progress)
    draft = load_model(args.draft, args.device, args.dtype, cache=not args.no_model_cache, progress=progress)
    out = args.out or check_output(
        default_cost_path(verifier[2]["name"], draft[2]["name"], args.dtype, args.device), directory=False
    )  # the default is known only once the models are: checked before the timing
    cost = calibrate_cost(
        verifier, draft, max_block=args.max_block, context=args.context, repeats=args.repeats, settings=_settings(args),
        progress=progress, prompt_lengths=args.prompt_lengths, second_context=args.second_context,
    )  # fmt: skip
    cost.save(out)
    blocks = cost.verify_block
    top = max(blocks)
    print(f"draft token {cost.draft_token * 1e3:.1f} ms; verifier block of 1: {blocks[1] * 1e3:.1f} ms, of {top}: "
          f"{blocks[top] * 1e3:.1f} ms ({blocks[top] / blocks[1]:.2f}x one token); step overhead "
          f"{cost.step_overhead * 1e3:.2f} ms; judging a token {cost.judge_token * 1e3:.2f} ms")  # fmt: skip
    print(f"draft / verifier cost ratio: {cost.draft_token / blocks[1]:.3f}")
    for name, per in cost.prefill.items():
        print(f"{name} prefill: " + ", ".join(f"{n} tokens {s:.2f} s" for n, s in per.items()))
    print(f"context slope per 1,000 tokens: verify {cost.context_slope['verify'] * 1e6:.1f} ms, draft "
          f"{cost.context_slope['draft'] * 1e6:.1f} ms")  # fmt: skip
    for problem in cost.problems():
        print(f"warning: {problem}")
    print(f"wrote {out}")
    return 0


def _cmd_plan(args) -> int:
    from .._analysis._analyze import analyze_trace, parse_rules
    from .._analysis._outputs import write_outputs
    from .._analysis._plan import CostModel, load_cost, predict_speedup
    from .._laws._policies import AUTO_POLICIES, make_draft_policy

    # the cost model and the policies are checked before the work
    if args.cost:
        cost = load_cost(args.cost)
    elif args.cost_ratio is not None:
        cost = CostModel.from_ratio(args.cost_ratio)
    else:
        cost = CostModel.from_profile(DEFAULT_COST_PROFILE if args.cost_profile is None else args.cost_profile)
    problems = cost.problems()
    if problems and not args.trust_cost:
        raise ValueError("the cost model cannot be trusted as it is: " + "; ".join(problems)
                         + ". Recalibrate on an idle machine, or plan anyway with --trust-cost")  # fmt: skip
    policies = []
    for spec in args.draft_policy or ():
        policies += list(AUTO_POLICIES) if spec == "auto" else [spec]
    for spec in policies:
        make_draft_policy(spec)
    _check_out(args, [*_trace_inputs(args), args.cost])
    traces = _traces(args)
    result = analyze_trace(
        traces, parse_rules(args.rules, args.delta), ms=args.m, n_boot=args.bootstrap, processes=args.processes,
        progress=_progress(args), tasks=args.task, draft_mode=args.draft_mode, draft_policies=policies, cost=cost,
    )  # fmt: skip
    plan = predict_speedup(result, cost, max_kl=args.max_kl, allow_untrusted=args.trust_cost,
                           prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens)  # fmt: skip
    kind = plan.cost.source.get("kind", "cost file")
    given = args.cost or args.cost_ratio is not None or args.cost_profile is not None
    default = "" if given else " (the default; --cost for this machine's calibration)"
    if kind == "profile":
        kind = (
            f"measured profile {plan.cost.source.get('name')} ({plan.cost.source.get('hardware')}, "
            f"{plan.cost.source.get('engine')}){default}"
        )
    elif kind == "ratio":
        kind = "a what-if ratio"
    ratio = plan.cost.draft_token / plan.cost.verify_block[1]
    print(f"{len(traces)} sequences, {traces.n_positions} positions; cost: {kind}, draft / verifier ratio {ratio:.3f}")
    for task in _tasks_to_show(plan.rows):
        print(f"\n{'all tasks' if task == 'all' else 'task ' + task}: predicted speedup at the best m")
        print(plan.table(task))
    if args.out:
        from .._analysis._plotting import figure_png, plot_plan
        from .._util._files import atomic_write

        written = [atomic_write(os.path.join(args.out, "plan.csv"), plan.to_csv().encode())]
        written.append(atomic_write(os.path.join(args.out, "plan.json"), plan.to_json().encode()))
        written.append(atomic_write(os.path.join(args.out, "plan.png"), figure_png(plot_plan(plan))))
        written += write_outputs(result, args.out, figures=False)
        for path in written:
            print(f"wrote {path}")
    return 0


def _cmd_merge(args) -> int:
    from .._data._traceset import merge_traces

    check_output(args.out)  # merge_traces refuses an output that is (inside) a part
    trace = merge_traces(args.out, args.parts, progress=_progress(args), allow_partial=args.allow_partial)
    partial = trace.metadata.get("partial")
    note = f" (partial: {partial['reason']})" if partial else ""
    print(f"merged {len(trace)} sequences, {trace.n_positions} positions into {args.out}{note}")
    return 0


def _cmd_decode(args) -> int:
    from .._analysis._analyze import parse_rules
    from .._data._prompts import Prompt
    from .._laws._policies import make_draft_policy
    from .._models._decode import NgramDrafter, check_chain_rule, decode_prompts, decoding_summary
    from .._models._hf import load_model

    _check_out(args, [*(args.prompts or []), *_model_inputs(args)], directory=False)
    rules = parse_rules([args.rule], [args.delta])
    if len(rules) != 1:
        raise ValueError(f"--rule must name one rule; {args.rule!r} gives {len(rules)}")
    (rule,) = rules
    check_chain_rule(rule)  # before loading any model
    policy = make_draft_policy(args.draft_policy)
    if policy is not None and policy.needs_cost:
        raise ValueError("--draft-policy cost-optimal needs a cost model: it is for 'plan'; decode with p-min(...), "
                         "entropy(...) or accept-prob(...)")  # fmt: skip
    if args.prompt is not None:
        prompts = [Prompt(id="prompt-0", task=args.task or "prompt", text=args.prompt, index=0)]
    else:
        prompts = _prompts_from(args)[: args.limit]
    settings = _settings(args)
    opts = {"cache": not args.no_model_cache, "progress": _progress(args)}
    verifier = load_model(args.verifier, args.device, args.dtype, **opts)
    draft = NgramDrafter() if args.draft == "ngram" else load_model(args.draft, args.device, args.dtype, **opts)[0]
    records = decode_prompts(
        verifier,
        draft,
        rule,
        prompts,
        m=args.m,
        settings=settings,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        baseline=args.baseline,
        bonus_policy=args.bonus_policy,
        out=args.out,
        progress=_progress(args),
        draft_mode=args.draft_mode,
        draft_policy=policy,
    )
    if args.prompt is not None:
        rec = records[0]
        print(rec["text"])
        print(
            f"[{rule.describe()} m={args.m}] {rec['tokens']} tokens, {len(rec['accepted'])} verifications, "
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
            print(decoding_summary(records, seed=args.seed))  # prefill apart, matched lengths, flags
        return 0
    print(decoding_summary(records, seed=args.seed))
    if args.out:
        print(f"records in {args.out}")
    return 0


def _cmd_rules(args) -> int:
    from .._rules import available_rules

    infos = available_rules()
    if args.json:
        print(
            json.dumps(
                {
                    name: {
                        "parameters": {k: _jsonable(v) for k, v in i.parameters.items()},
                        "fixed": i.fixed,
                        "summary": i.summary,
                        "reference": i.reference,
                        "module": i.rule_class.__module__,
                    }
                    for name, i in infos.items()
                },
                indent=1,
            )
        )
        return 0
    width = max(len(i.signature()) for i in infos.values())
    for info in infos.values():
        origin = "" if info.builtin else f" [plugin {info.rule_class.__module__}]"
        print(f"{info.signature():<{width}}  {info.summary}{origin}")
    return 0


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


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

    takers = [name for name, info in available_rules().items() if "delta" in info.rule_class.grid_parameters
              and "delta" in info.parameters]  # fmt: skip
    return (f"divergence budgets of the rules that take one and set none ({', '.join(takers)}); other rules "
            "keep their own parameters")  # fmt: skip


def _cmd_compare(args) -> int:
    from .._studies._zoo import compare_rules, write_comparison

    _check_out(args, _trace_inputs(args))
    start = time.perf_counter()
    traces = _traces(args)
    comparison = compare_rules(traces, n_boot=args.bootstrap, processes=args.processes, progress=_progress(args))
    command = f"cactus-theory compare {' '.join(args.trace or [])} --bootstrap {args.bootstrap}".replace("  ", " ")
    label = ", ".join(args.trace) if args.trace else None
    paths = write_comparison(comparison, args.out, command=command, seconds=time.perf_counter() - start,
                             trace_label=label)  # fmt: skip
    with open(paths[0], encoding="utf-8") as fh:
        print(fh.read())
    for path in paths:
        print(f"wrote {path}")
    return 0


def _cmd_report(args) -> int:
    from .._studies._report import build_report

    _check_out(args, [args.trace])
    timings = []
    start = time.perf_counter()
    table = build_report(args.out, trace=args.trace, progress=_progress(args), timings=timings)
    print(table)
    if args.profile:
        print("\nwhere the time went:")
        for name, seconds in timings:
            print(f"  {seconds:7.1f} s  {name}")
        print(f"  {time.perf_counter() - start:7.1f} s  total")
    print(f"report written to {os.path.join(args.out, 'report.md')} and report.html")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one line per refusal: 'cactus-theory CMD: error: ... (cactus-theory CMD --help)',
    exit 2, instead of the usage block and the error."""

    def error(self, message):
        first = " ".join(str(message).split())
        if len(first) > 600:
            first = first[:600] + "..."
        self.exit(2, f"{self.prog}: error: {first} (see {self.prog} --help)\n")


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


def _draft_mode_option(parser):
    parser.add_argument(
        "--draft-mode",
        choices=("sampled", "greedy"),
        default="sampled",
        help="how the drafter drafts: sampled from p, or greedy (argmax p, one-hot for the rule: MTP heads, EAGLE)",
    )


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
Models: a GGUF file is dequantised on its first load (about 45 s per billion parameters on 2
cores, several minutes on a busy machine; a message says so) and cached; later loads take
seconds. Memory: the Qwen2.5-Coder 1.5B + 0.5B pair peaks at 9-11 GB during dump, calibrate
and decode (float32 weights of both models and transformers' load); bfloat16 halves the
weights once loaded."""


def _model_options(parser):
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="model dtype")
    parser.add_argument(
        "--no-model-cache",
        action="store_true",
        help="dequantise GGUF files on every load instead of caching the weights (in $CACTUS_THEORY_CACHE or "
        "~/.cache/cactus_theory)",
    )


def _prompt_file_options(parser, group=None):
    """--prompts (required, or in ``group``, e.g. beside --prompt) and the options that read them."""
    from .._data._prompts import DATASETS

    (group or parser).add_argument(
        "--prompts", nargs="+", required=group is None, default=None, help="prompt files (formats below)"
    )
    parser.add_argument(
        "--dataset", choices=DATASETS, default=None, help="read the files as this benchmark, with its instruction"
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
    parser.add_argument("--per-file", type=_int_at_least(0), default=None, help="first N prompts of each file")


def build_parser() -> argparse.ArgumentParser:
    from .._data._prompts import RECORD_FORMATS

    parser = _Parser(
        prog="cactus-theory",
        description="Theory and simulation of speculative-decoding acceptance rules (Cactus, ICLR 2026).",
        formatter_class=_Formatter,
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument(
        "--plugin",
        action="append",
        metavar="MODULE",
        help="import this module first, so that the rules it defines are registered (repeatable; a module on "
        "the Python path or MODULE.py in the current directory). Installed packages can instead declare the "
        "entry point group 'cactus_theory.rules'",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser(
        "gamma", help="exact and approximate Cactus bonus gamma for one q(n) and delta", formatter_class=_Formatter
    )
    g.add_argument(
        "--target-prob", type=_probability, required=True, help="verifier probability q(n) of the drafted token"
    )
    g.add_argument("--delta", type=_budget, required=True, help="divergence budget delta >= 0")
    g.add_argument("--divergence", default="kl", choices=available_divergences(), help="f-divergence")
    g.add_argument(
        "--draft-prob", type=_probability, default=None, help="draft probability p(n): also print min(1, gamma/p(n))"
    )
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g.set_defaults(func=_cmd_gamma)

    rl = sub.add_parser(
        "rules",
        help="list the registered acceptance rules with their parameters and defaults",
        formatter_class=_Formatter,
    )
    rl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    rl.set_defaults(func=_cmd_rules)

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
    d.set_defaults(func=_cmd_dump)

    a = sub.add_parser(
        "analyze",
        help="acceptance, AL and emitted drift of rules on a trace",
        epilog=_rules_epilog(),
        formatter_class=_Formatter,
    )
    a.add_argument(
        "trace",
        nargs="*",
        default=None,
        help="trace directories or glob patterns, analysed as one set (default: the embedded trace)",
    )
    a.add_argument("--rules", default="sps,tas,cactus,cactus-exact,mentored", help="rule specs (see below)")
    a.add_argument("--delta", type=_floats, default=[0.25, 0.5, 1.0, 2.0], help=_delta_help())
    a.add_argument("--m", type=_ints, default=[4, 8, 20], help="drafted tokens per verification")
    a.add_argument("--task", action="append", default=None, help="analyse only this task (repeatable)")
    a.add_argument(
        "--temperature", type=float, default=None, help="override the trace's sampling settings (with --top-k/--top-p)"
    )
    a.add_argument("--top-k", type=_int_at_least(0), default=20, help="top-k with --temperature")
    a.add_argument("--top-p", type=float, default=0.95, help="top-p with --temperature")
    a.add_argument(
        "--bootstrap", type=_resamples, default=1000, help="bootstrap resamples for the 95%% intervals (0: none)"
    )
    a.add_argument("--processes", type=_int_at_least(1), default=1, help="local worker processes over shards")
    engine = a.add_mutually_exclusive_group()
    engine.add_argument(
        "--scheduler", default=None, metavar="ADDRESS", help="run the shards on this Dask scheduler (tcp://HOST:PORT)"
    )
    engine.add_argument(
        "--workers", type=_int_at_least(1), default=None, help="run the shards on a local Dask cluster of N workers"
    )
    a.add_argument("--out", default=None, help="write analysis.csv, analysis.json and figures here")
    a.add_argument("--no-figures", action="store_true", help="with --out: tables only")
    _bonus_policy_option(a)
    _draft_mode_option(a)
    _progress_options(a)
    a.set_defaults(func=_cmd_analyze)

    c = sub.add_parser(
        "decode",
        help="speculative decoding with real models and any rule, on one prompt or a file of them",
        epilog=_rules_epilog() + "\n\n" + RECORD_FORMATS + "\n\n" + MODEL_MEMORY,
        formatter_class=_Formatter,
    )
    c.add_argument("--verifier", required=True, help="verifier: Hugging Face id, local directory or .gguf file")
    c.add_argument("--draft", required=True, help="draft model (as --verifier), or 'ngram' for prompt lookup")
    c.add_argument("--rule", default="cactus", help="one rule spec, e.g. 'cactus(delta=1)' or 'lossy(alpha=0.7)'")
    c.add_argument("--delta", type=float, default=1.0, help="delta of a rule spec that does not set one")
    c.add_argument("-m", type=_int_at_least(1), default=8, help="drafted tokens per verification")
    one = c.add_mutually_exclusive_group(required=True)
    one.add_argument("--prompt", default=None, help="one prompt's text")
    _prompt_file_options(c, one)
    c.add_argument("--limit", type=_int_at_least(0), default=None, help="at most this many prompts")
    c.add_argument("--baseline", action="store_true", help="also decode every prompt with the verifier alone: speedups")
    c.add_argument("--out", default=None, help="JSON Lines of per-prompt records (appended; a rerun skips done ones)")
    c.add_argument("--max-new-tokens", type=_int_at_least(1), default=128, help="tokens generated per prompt")
    _sampling_options(c)
    c.add_argument("--seed", type=_int_at_least(0), default=0, help="sampling seed")
    _model_options(c)
    _bonus_policy_option(c)
    _draft_mode_option(c)
    c.add_argument(
        "--draft-policy",
        default=None,
        help="stop a block early when the drafter is unsure: p-min(0.4), entropy(1), accept-prob(0.3)",
    )
    _progress_options(c)
    c.set_defaults(func=_cmd_decode)

    cb = sub.add_parser(
        "calibrate",
        help="time a model pair's forward passes on this machine: a cost file for 'plan'",
        formatter_class=_Formatter,
        epilog=MODEL_MEMORY,
    )
    cb.add_argument("--verifier", required=True, help="verifier: Hugging Face id, local directory or .gguf file")
    cb.add_argument("--draft", required=True, help="draft model: Hugging Face id, local directory or .gguf file")
    _model_options(cb)
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
        "--out", default=None, help="cost file (default: in the user cache, named by models, dtype, device)"
    )
    _progress_options(cb)
    cb.set_defaults(func=_cmd_calibrate)

    pl = sub.add_parser(
        "plan",
        help="predicted wall-time speedup of every rule, delta and m on a trace, and the best setting",
        epilog=_rules_epilog(),
        formatter_class=_Formatter,
    )
    pl.add_argument("trace", nargs="*", default=None, help="trace directories or globs (default: the embedded trace)")
    costs = pl.add_mutually_exclusive_group()
    costs.add_argument("--cost", default=None, help="cost file from 'calibrate' (or written by hand)")
    costs.add_argument(
        "--cost-ratio",
        type=_nonnegative("a cost ratio", finite=True),
        default=None,
        help="a what-if: draft token cost / verifier token cost, block cost flat in m",
    )
    costs.add_argument(
        "--cost-profile",
        default=None,
        help="a published measured profile shipped with the package (default, when no cost is given: "
        f"{DEFAULT_COST_PROFILE}; an unknown name lists them)",
    )
    pl.add_argument(
        "--draft-policy",
        action="append",
        default=None,
        help="also plan with this drafting policy (p-min(0.4), entropy(1), accept-prob(0.3), cost-optimal; "
        "repeatable; 'auto': a sweep of each)",
    )
    pl.add_argument("--trust-cost", action="store_true", help="plan even from a cost model with problems")
    pl.add_argument(
        "--prompt-tokens",
        type=_nonnegative("a token count", finite=True),
        default=None,
        help="prompt length of the predicted requests (default: the trace's, per task)",
    )
    pl.add_argument(
        "--output-tokens",
        type=_nonnegative("a token count", finite=True),
        default=None,
        help="output length of the predicted requests (default: the trace's, per task)",
    )
    pl.add_argument(
        "--max-kl",
        type=_nonnegative("a KL bound", finite=True, hint=" (leave --max-kl out for no bound)"),
        default=None,
        help="bound on the mean emitted KL(pi || q) per position",
    )
    pl.add_argument("--rules", default="sps,tas,cactus,cactus-exact,mentored", help="rule specs (see below)")
    pl.add_argument("--delta", type=_floats, default=[0.25, 0.5, 1.0, 2.0], help=_delta_help())
    pl.add_argument("--m", type=_ints, default=[1, 2, 3, 4, 6, 8, 10, 12, 16, 20], help="draft lengths to compare")
    pl.add_argument("--task", action="append", default=None, help="only this task (repeatable)")
    pl.add_argument("--bootstrap", type=_resamples, default=1000, help="bootstrap resamples (0: no intervals)")
    pl.add_argument("--processes", type=_int_at_least(1), default=1, help="local worker processes over shards")
    pl.add_argument("--out", default=None, help="write plan.csv, plan.json, plan.png and the analysis here")
    _draft_mode_option(pl)
    _progress_options(pl)
    pl.set_defaults(func=_cmd_plan)

    mg = sub.add_parser(
        "merge",
        help="merge the parts of a split dump (dump --part I/N) into one trace",
        formatter_class=_Formatter,
    )
    mg.add_argument("parts", nargs="+", help="the parts' trace directories or glob patterns")
    mg.add_argument(
        "--out",
        required=True,
        help="the merged trace: a new directory, never one of the parts (a rerun with the same parts resumes)",
    )
    mg.add_argument(
        "--allow-partial",
        action="store_true",
        help="merge an incomplete split (missing parts, parts of different splits, whole dumps), marked partial",
    )
    _progress_options(mg)
    mg.set_defaults(func=_cmd_merge)

    cp = sub.add_parser(
        "compare",
        help="every registered rule at its declared settings (the paper grid), each with its bonus policy, on a trace",
        formatter_class=_Formatter,
    )
    cp.add_argument("trace", nargs="*", default=None, help="trace directories or globs (default: the embedded trace)")
    cp.add_argument("--out", default="rules_comparison", help="write rules_comparison.md / .json / .png here")
    cp.add_argument("--bootstrap", type=_resamples, default=1000, help="bootstrap resamples (0: no intervals)")
    cp.add_argument("--processes", type=_int_at_least(1), default=1, help="local worker processes over shards")
    _progress_options(cp)
    cp.set_defaults(func=_cmd_compare)

    r = sub.add_parser(
        "report",
        help="the main job: a report from the embedded trace and a synthetic suite",
        formatter_class=_Formatter,
    )
    r.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    r.add_argument("--out", default="cactus_report", help="output directory")
    r.add_argument("--profile", action="store_true", help="print the seconds of each section (also in report.md)")
    _progress_options(r)
    r.set_defaults(func=_cmd_report)
    return parser


def _explain(exc: BaseException):
    """(exit code, one line) for an expected failure: 2 for bad arguments or input, 1 for the rest."""
    from .._data._trace import TraceError

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, (ValueError, TraceError, TypeError)):
        return 2, first
    if isinstance(exc, ConnectionError):  # a scheduler that does not answer: the message says what to do
        return 1, first
    if isinstance(exc, OSError):
        what = exc.strerror or first
        where = f": {exc.filename}" if exc.filename else ""
        hint = {
            FileNotFoundError: "check the path",
            PermissionError: "choose a directory you can write to",
            NotADirectoryError: "a parent of that path is a file",
            IsADirectoryError: "give a file, not a directory",
        }.get(type(exc), "check the path and the disk")
        return 1, f"{what}{where} ({hint})"
    if isinstance(exc, ImportError):
        if "pip install" in first:
            return 1, first
        return 1, f"{first}: install the models extra, pip install 'cactus_theory[models]'"
    return 1, f"{type(exc).__name__}: {first} (run with --debug for the traceback)"


def _take_plugins(argv):
    """(the --plugin modules, argv without them): taken out wherever they stand, so that the
    rules they register are known before the parser lists the rules in its help."""
    modules, rest, items = [], [], list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if item == "--plugin" and i + 1 < len(items):
            modules.append(items[i + 1])
            i += 2
            continue
        if item.startswith("--plugin="):
            modules.append(item.split("=", 1)[1])
        else:
            rest.append(item)
        i += 1
    return modules, rest


def import_plugin(name: str):
    """Import a plugin module by name (or a path to a .py file); the current directory (or the
    file's) is put on the Python path, for this process and the worker processes it starts."""
    import importlib

    directory = os.getcwd()
    if name.endswith(".py"):
        directory, name = os.path.dirname(os.path.abspath(name)), os.path.basename(name)[:-3]
    if not name.replace(".", "").replace("_", "").isalnum():
        raise ValueError(f"--plugin {name!r} is not a module name (e.g. my_rules, or my_rules.py)")
    if directory not in sys.path:
        sys.path.insert(0, directory)
        parts = [directory, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)  # Dask workers start fresh interpreters
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name.split(".")[0]:
            raise ValueError(
                f"--plugin {name!r}: no module named {name!r} (put {name}.py in the current directory or its package "
                "on PYTHONPATH)"
            ) from None
        raise


def _plugin_problems(modules, report=True) -> None:
    """Refuse a --plugin module whose rule classes cannot be used (a parameter without a default);
    warn, one line each, about entry-point plugins that failed to import (their rules are
    unavailable; every other command works). Rule warnings are then silenced for the process, so
    each is said once, the same way every time."""
    import warnings

    from .._rules import RulePluginWarning, available_rules, plugin_errors

    names = {m.__name__ for m in modules}
    for key, line in plugin_errors().items():
        from .._rules._registry import _REGISTRY

        cls = _REGISTRY.get(key, (None,))[0]
        if cls is not None and cls.__module__ in names:
            raise ValueError(f"--plugin {cls.__module__}: {line}")
        if report:
            print(f"cactus-theory: warning: {line}", file=sys.stderr)
    warnings.simplefilter("ignore", RulePluginWarning)
    available_rules()  # listed once here; the warnings above stand for every later listing


def main(argv=None) -> int:
    plugins, argv = _take_plugins(sys.argv[1:] if argv is None else argv)
    try:
        modules = [import_plugin(name) for name in plugins]
        command = next((a for a in argv if not a.startswith("-")), None)
        _plugin_problems(modules, report=command != "gamma")  # gamma is the one command without rules
    except Exception as exc:
        if "--debug" in argv:
            raise
        code, line = _explain(exc)
        print(f"cactus-theory: error: {line}", file=sys.stderr)
        return code
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("cactus-theory: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        code, line = _explain(exc)
        print(f"cactus-theory: error: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
