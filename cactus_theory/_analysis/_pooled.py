"""Any rule's accuracy on open-ended answers from one pool of answers, weighted by their exact likelihoods.

Every decoded method's answers to a problem are draws from its own law of whole answers; ``answer_log_prob`` gives
the exact probability of each answer under any token rule at any draft length (and under the verifier alone). So
a rule's expected accuracy on problem i, E_R[g], is estimated from all the answers of all decoded methods at once
by multiple importance sampling with the balance heuristic (Veach & Guibas, 1995):

    S_i(R) = sum_j g(Y_j) w_j(R),   w_j(R) = P_R(Y_j) / sum_d n_{d,i} P_d(Y_j),

the sum over the problem's answers Y_j, the mixture over the decoded methods d with n_{d,i} answers each.
S_i is unbiased where the decoded methods together can emit whatever R can; the weights' own sum W_i(R) =
sum_j w_j(R) then has expectation exactly 1, a control variate: the estimate is mean_i S_i - beta (mean_i W_i - 1)
with beta the least-squares slope of S on W over the problems (0 where W does not vary, as for a rule whose law
is a decoded method's). A rule's difference from the reference (the verifier alone) is the difference of the two
pooled estimates on the same answers, paired; every interval is a percentile bootstrap over problems (the slope
fitted again in each resample). The mean weight (mean_i W_i, near 1 where the pool covers the rule's answers; a
mean well below 1 says it does not) and the effective sample size (Kish's, (sum_j w_j)^2 / sum_j w_j^2 per problem,
summed) say how much the pool tells about a rule: below ``min_ess`` effective answers a problem the pooled
estimate is not used and the rule falls back to its own answers where it was decoded (paired with the reference's
own answers on the same problems), and is refused (NaN, with the reason) where it was not.

Exact: the weights (from exact likelihoods). Approximate: the estimates (Monte Carlo over the answers, the control
variate's slope fitted), the intervals (bootstrap).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._math._validation import check_int

__all__ = ["PooledAccuracy", "pooled_accuracy", "pooled_from_records", "pooled_on_choice_records", "pooled_table"]

ALONE = "verifier alone"


@dataclass(frozen=True)
class PooledAccuracy:
    """One rule's accuracy from the pool (``pooled_accuracy``). ``estimate``: "pooled", "own answers" (the pool's
    effective sample too small; the rule's own answers) or "refused" (too small and never decoded: NaN values).
    Accuracies and differences are fractions (0..1); ``*_lo`` / ``*_hi`` the bootstrap interval's ends."""

    method: str
    problems: int
    estimate: str
    accuracy: float
    accuracy_lo: float
    accuracy_hi: float
    difference: float
    difference_lo: float
    difference_hi: float
    ess: float
    ess_per_problem: float
    mean_weight: float
    reason: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _check(problem, decoded_by, grade, log_probs):
    problem = np.asarray(problem)
    decoded_by = np.asarray(decoded_by, dtype=object)
    grade = np.asarray(grade, dtype=np.float64)
    count = problem.shape[0] if problem.ndim == 1 else -1
    if count < 1 or decoded_by.shape != (count,) or grade.shape != (count,):
        raise ValueError(
            "problem, decoded_by and grade: one entry per answer, the same number of each; got shapes "
            f"{problem.shape}, {decoded_by.shape}, {grade.shape}"
        )
    if not np.all((grade >= 0) & (grade <= 1)):
        raise ValueError("grade: each answer's grade must lie in [0, 1] (1 = correct); got a value outside or NaN")
    table = {}
    for label, values in log_probs.items():
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (count,) or np.any(np.isnan(values)) or np.any(values > 1e-9):
            raise ValueError(
                f"log_probs[{label!r}]: one log-probability per answer ({count}), each <= 0 and not NaN (-inf: an "
                "answer the method cannot emit)"
            )
        table[label] = np.minimum(values, 0.0)
    missing = sorted(set(decoded_by.tolist()) - set(table))
    if missing:
        raise ValueError(f"log_probs: give each decoding method's own log-probabilities; missing {missing}")
    return problem, decoded_by, grade, table


def _log_mixture(problem, index, decoded_by, table):
    """Each answer's log of the balance heuristic's denominator, sum_d n_{d,i} P_d(Y_j), over the decoding
    methods with their answer counts on its problem (once a pool: every label's weights share it)."""
    size = int(index.max()) + 1
    methods = sorted(set(decoded_by.tolist()))
    counts = np.zeros((size, len(methods)))
    for k, d in enumerate(methods):
        np.add.at(counts[:, k], index[decoded_by == d], 1.0)
    with np.errstate(divide="ignore"):
        terms = np.stack([np.log(counts[index, k]) + table[d] for k, d in enumerate(methods)])
    top = terms.max(0)
    if not np.all(np.isfinite(top)):
        j = int(np.flatnonzero(~np.isfinite(top))[0])
        raise ValueError(
            f"answer {j} (problem {problem[j]!r}, decoded by {decoded_by[j]!r}) has probability 0 under every decoding "
            "method, its own included: its log-probabilities do not belong to it"
        )
    return top + np.log(np.exp(terms - top).sum(0))


def _sums(index, size, grade, log_probs, log_mix):
    """Per problem (S_i, W_i, sum_j w_j^2) of one method's ``log_probs`` over the pool."""
    w = np.exp(log_probs - log_mix)
    s = np.bincount(index, weights=grade * w, minlength=size)
    total = np.bincount(index, weights=w, minlength=size)
    square = np.bincount(index, weights=w * w, minlength=size)
    return s, total, square


def _control(s, w):
    """The control-variate estimates of each resample (rows of ``s`` and ``w``: problems of one resample)."""
    s_bar, w_bar = s.mean(-1), w.mean(-1)
    dw = w - w_bar[..., None]
    var = (dw * dw).sum(-1)
    cov = (dw * (s - s_bar[..., None])).sum(-1)
    scale = np.maximum(np.abs(w_bar), 1.0)
    beta = np.where(var > 1e-24 * scale**2 * w.shape[-1], cov / np.where(var > 0, var, 1.0), 0.0)
    return s_bar - beta * (w_bar - 1.0)


def _interval(values, alpha):
    return tuple(float(v) for v in np.quantile(values, [alpha / 2, 1 - alpha / 2]))


def pooled_accuracy(
    problem,
    decoded_by,
    grade,
    log_probs,
    methods,
    *,
    reference=ALONE,
    n_boot=2000,
    seed=0,
    alpha=0.05,
    min_ess=1.0,
) -> list:
    """Each method's accuracy and its paired difference from ``reference`` from one pool of graded answers (see
    the module docstring).

    Parameters
    ----------
    problem, decoded_by, grade : sequences, one entry per answer
        The problem each answer answers, the method that decoded it (a key of ``log_probs``) and its grade in
        [0, 1].
    log_probs : dict {label: (answers,) array}
        Each answer's exact log-probability under every decoding method and every method asked for
        (``answer_log_prob``; -inf where a method cannot emit it).
    methods : sequence of labels
        The methods to estimate (keys of ``log_probs``); ``reference`` is estimated too.
    n_boot, seed, alpha : the percentile bootstrap over problems (``n_boot`` resamples) and its level.
    min_ess : effective answers per problem below which a method's pooled estimate is not used (default 1: as
        much as decoding the method once; below it the weights are too heavy-tailed for the bootstrap to be
        trusted: on GSM8K a pool with 0.33 effective answers a problem put a rule 50 points from its own answers).

    Returns
    -------
    list of PooledAccuracy, the reference first.
    """
    problem, decoded_by, grade, table = _check(problem, decoded_by, grade, log_probs)
    if reference not in table:
        raise ValueError(f"reference: {reference!r} has no log-probabilities (a key of log_probs)")
    unknown = [m for m in methods if m not in table]
    if unknown:
        raise ValueError(f"methods: {unknown} have no log-probabilities (keys of log_probs)")
    check_int(n_boot, "n_boot", 100, what="bootstrap resamples")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1); got {alpha!r}")
    ids, index = np.unique(problem, return_inverse=True)
    size = ids.size
    rng = np.random.default_rng(seed)
    resample = rng.integers(0, size, (int(n_boot), size))
    labels = [reference, *(m for m in methods if m != reference)]
    log_mix = _log_mixture(problem, index, decoded_by, table)
    sums = {label: _sums(index, size, grade, table[label], log_mix) for label in labels}
    pooled, boots = {}, {}
    for label, (s, w, _) in sums.items():
        pooled[label] = float(_control(s[None], w[None])[0])
        boots[label] = _control(s[resample], w[resample])
    own = _own_answers(index, size, decoded_by, grade)
    out = []
    for label in labels:
        s, w, square = sums[label]
        with np.errstate(invalid="ignore", divide="ignore"):
            ess = float(np.where(square > 0, w * w / np.where(square > 0, square, 1.0), 0.0).sum())
        row = {
            "method": label,
            "problems": int(size),
            "ess": ess,
            "ess_per_problem": ess / size,
            "mean_weight": float(w.mean()),
        }
        if ess / size >= min_ess:
            lo, hi = _interval(boots[label], alpha)
            d = boots[label] - boots[reference]
            d_lo, d_hi = _interval(d, alpha)
            out.append(
                PooledAccuracy(
                    **row,
                    estimate="pooled",
                    accuracy=pooled[label],
                    accuracy_lo=lo,
                    accuracy_hi=hi,
                    difference=pooled[label] - pooled[reference],
                    difference_lo=d_lo,
                    difference_hi=d_hi,
                )
            )
            continue
        reason = f"{ess / size:.3g} effective answers a problem in the pool, below min_ess = {min_ess:g}"
        if label in own and reference in own:
            out.append(_fallback(row, own, label, reference, rng, int(n_boot), alpha, reason))
        else:
            nan = float("nan")
            out.append(
                PooledAccuracy(
                    **row,
                    estimate="refused",
                    accuracy=nan,
                    accuracy_lo=nan,
                    accuracy_hi=nan,
                    difference=nan,
                    difference_lo=nan,
                    difference_hi=nan,
                    reason=f"{reason}, and never decoded: decode it (or with a closer method) to estimate it",
                )
            )
    return out


def _own_answers(index, size, decoded_by, grade):
    """{method: (mean grade per problem, answered mask)} of each decoded method's own answers."""
    out = {}
    for d in sorted(set(decoded_by.tolist())):
        mine = decoded_by == d
        n = np.bincount(index[mine], minlength=size).astype(np.float64)
        g = np.bincount(index[mine], weights=grade[mine], minlength=size)
        with np.errstate(invalid="ignore"):
            out[d] = (np.where(n > 0, g / np.where(n > 0, n, 1.0), np.nan), n > 0)
    return out


def _fallback(row, own, label, reference, rng, n_boot, alpha, reason):
    """The rule's own answers, on the problems both it and the reference answered: mean and paired difference,
    each with a percentile bootstrap over those problems."""
    mean_l, has_l = own[label]
    mean_r, has_r = own[reference]
    keep = np.flatnonzero(has_l & has_r)
    if not keep.size:
        raise ValueError(f"{label!r} and {reference!r} answered no problem in common: no paired fallback")
    mine = mean_l[has_l]
    diff = mean_l[keep] - mean_r[keep]
    lo, hi = _interval(mine[rng.integers(0, mine.size, (n_boot, mine.size))].mean(-1), alpha)
    d_lo, d_hi = _interval(diff[rng.integers(0, diff.size, (n_boot, diff.size))].mean(-1), alpha)
    return PooledAccuracy(
        **row,
        estimate="own answers",
        accuracy=float(mine.mean()),
        accuracy_lo=lo,
        accuracy_hi=hi,
        difference=float(diff.mean()),
        difference_lo=d_lo,
        difference_hi=d_hi,
        reason=f"{reason}: its own answers ({mine.size} problems; {keep.size} paired with {reference!r})",
    )


def pooled_from_records(
    records, rules=(), *, ms=None, settings=None, n_boot=2000, seed=0, alpha=0.05, min_ess=1.0, by_benchmark=True
) -> list:
    """The sampled referee's answers (records made with ``rows``: each answer's kept rows at every position) as
    one pool a benchmark: every decoded method and each rule of ``rules`` (token rules, specs or objects) at each
    draft length of ``ms`` (default: the records' own m), estimated by ``pooled_accuracy`` from the exact
    likelihood of every answer under every method (``sequence_log_probs``), without a model. ``settings``: the
    sampling and its chain (default: the records'). ``by_benchmark``: one pool a benchmark (else one pool of every
    problem, benchmark "all"). Rows (dicts) per benchmark: "benchmark", "method", "rule" (the method without its
    m), "m",
    "answers" (the pool), "dropped" (answers whose recomputed rows give probability 0 under their own method: the
    teacher-forced rows and the decoding's differ in rounding; never used), and ``PooledAccuracy``'s fields."""
    from .._math._sampling import SamplingSettings
    from .._rules._registry import as_rule
    from ._answer_rows import sequence_log_probs
    from ._referee_summary import read_records, summarize_records

    if not isinstance(records, list):
        records = read_records(records)
    held = [r for r in records if "rows" in r]
    if not held:
        raise ValueError(
            "records: no answer keeps its rows (run the sampled referee with rows, `cactus-theory evaluate --rows 20`)"
        )
    setting = held[0].get("setting") or {}
    other = next((r for r in held if (r.get("setting") or {}) != setting), None)
    if other is not None:
        raise ValueError(f"records: answers of different settings ({other['id']!r}): pool each run's records apart")
    made = SamplingSettings.from_dict(setting.get("sampling"), "the records' setting.sampling")
    settings = settings or made
    m0 = int(setting.get("m", 0) or 0)
    if m0 < 1:
        raise ValueError("records: their setting names no draft length m")
    decoded = sorted({r["method"] for r in held})
    proposals = {label: (None if label == ALONE else as_rule(label), m0) for label in decoded}
    targets = dict(proposals)
    for rule in (as_rule(r) for r in rules):
        for m in ms or [m0]:
            label = rule.describe() if m == m0 else f"{rule.describe()} @ m={m}"
            targets.setdefault(label, (rule, int(m)))
    need_rules = {t[0].describe(): t[0] for t in targets.values() if t[0] is not None}
    need_ms = sorted({m for _, m in targets.values()})
    log_probs = {label: [] for label in targets}
    for rec in held:
        where = f"record of {rec['id']!r} ({rec['method']}, sample {rec['sample']})"
        lp = sequence_log_probs(
            rec["rows"], rec["token_ids"], list(need_rules.values()), need_ms, settings, where=where
        )
        for label, (rule, m) in targets.items():
            log_probs[label].append(lp[ALONE if rule is None else rule.describe()][need_ms.index(m)])
    log_probs = {k: np.asarray(v) for k, v in log_probs.items()}
    by = np.array([r["method"] for r in held], dtype=object)
    own = np.array([log_probs[label][i] for i, label in enumerate(by)])
    usable = np.isfinite(own)
    out = []
    benches = sorted({r["benchmark"] for r in held}) if by_benchmark else ["all"]
    for bench in benches:
        part = np.array([bench in ("all", r["benchmark"]) for r in held])
        mine = part & usable
        dropped = int((part & ~usable).sum())
        problem = np.array([f"{r['benchmark']}|{r['id']}" for r in held], dtype=object)[mine]
        grade = np.array([float(bool(r["correct"])) for r in held])[mine]
        rows = pooled_accuracy(
            problem,
            by[mine],
            grade,
            {k: v[mine] for k, v in log_probs.items()},
            [k for k in targets if k != ALONE],
            n_boot=n_boot,
            seed=seed,
            alpha=alpha,
            min_ess=min_ess,
        )
        own = None
        for r in rows:
            if r.estimate == "own answers":  # the sampled referee's own row: the same number everywhere it is printed
                if own is None:
                    part_records = [rec for rec, keep in zip(held, part, strict=True) if keep]
                    summary = summarize_records(part_records, n_boot=n_boot, seed=seed)
                    by_bench = {}
                    for x in summary.rows:
                        by_bench.setdefault(x["benchmark"], {})[x["method"]] = x
                    own = by_bench.get(bench) or by_bench.get("all") or next(iter(by_bench.values()))
                row = own[r.method]
                r = PooledAccuracy(
                    **{
                        **r.as_dict(),
                        "accuracy": row["accuracy"],
                        "accuracy_lo": float("nan"),
                        "accuracy_hi": float("nan"),
                        "difference": row["difference"],
                        "difference_lo": row["low"],
                        "difference_hi": row["high"],
                        "reason": f"{r.reason.split(': its own answers')[0]}: the sampled referee's row (its own "
                        "answers, paired with the verifier alone's, every answer counted)",
                    }
                )
            out.append(
                {
                    "benchmark": bench,
                    **{k: v for k, v in r.as_dict().items() if k != "method"},
                    "method": r.method,
                    "rule": ALONE if targets[r.method][0] is None else targets[r.method][0].describe(),
                    "m": targets[r.method][1],
                    "decoded": r.method in proposals,
                    "answers": int(mine.sum()),
                    "dropped": dropped,
                }
            )
    return out


def pooled_table(rows) -> str:
    """``pooled_from_records``'s rows as a Markdown table (accuracies and differences in points)."""

    def pts(x):
        return "-" if not np.isfinite(x) else f"{100 * x:+.1f}"

    head = (
        "| benchmark | method | m | decoded | estimate | accuracy % [95%] | difference, points [95%] | "
        "effective answers / problem | mean weight |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        acc = "-" if not np.isfinite(r["accuracy"]) else f"{100 * r['accuracy']:.1f}"
        if np.isfinite(r["accuracy"]) and np.isfinite(r["accuracy_lo"]):
            acc += f" [{100 * r['accuracy_lo']:.1f}, {100 * r['accuracy_hi']:.1f}]"
        diff = (
            "reference"
            if r["method"] == ALONE
            else f"{pts(r['difference'])} [{pts(r['difference_lo'])}, {pts(r['difference_hi'])}]"
        )
        lines.append(
            f"| {r['benchmark']} | {r['method']} | {r['m']} | {'yes' if r['decoded'] else 'no'} | {r['estimate']} | "
            f"{acc} | {diff} | {r['ess_per_problem']:.2f} | {r['mean_weight']:.3f} |"
        )
    return "\n".join(lines)


def pooled_on_choice_records(
    records, decoded, rules, *, seed=0, n_boot=2000, alpha=0.05, min_ess=1.0, settings=None
) -> dict:
    """The pooled estimator where the truth is known: on the exact referee's records (each problem's answer rows,
    ``exact_choice_referee``), one answer token a problem is drawn from each method of ``decoded`` (token rules;
    "verifier alone" is always drawn) by its exact law there, graded by the correct letter, and every method of
    ``decoded`` and ``rules`` estimated from that pool (``pooled_accuracy``: the weights are the laws' own
    probabilities of the drawn tokens). {"pooled": PooledAccuracy rows, "exact": the exact referee's summary rows
    of the same methods on the same records (``rescore_exact`` then ``summarize_exact``), "agree": {method: the
    exact difference lies in the pooled interval}}. Exact: the laws; Monte Carlo: the draws."""
    from .._laws._emitted import emitted_distribution
    from .._math._sampling import SamplingSettings, processed_probs
    from .._rules._registry import as_rule
    from ._answer_rows import _batch, _confinement, _rule_logits, read_answer_rows
    from ._referee_summary import read_exact_records, summarize_exact
    from ._rescore import rescore_exact

    if not isinstance(records, list):
        records = read_exact_records(records)
    alone = [r for r in records if r.get("method") == ALONE and "rows" in r]
    if not alone:
        raise ValueError("records: no verifier-alone record keeps its answer rows (the exact referee's records)")
    setting = alone[0].get("setting") or {}
    settings = settings or SamplingSettings.from_dict(setting.get("sampling"), "the records' setting.sampling")
    rows = [read_answer_rows(r["rows"], f"record of {r['id']!r}") for r in alone]
    _confinement(rows, settings)
    values, known, floor, lse, correct = _batch(rows)
    q = processed_probs(values["target"], settings)
    p = processed_probs(values["draft"], settings)
    drawn = [as_rule(r) for r in decoded]
    asked = [as_rule(r) for r in rules]
    methods = {ALONE: None, **{r.describe(): r for r in drawn + asked}}
    laws = {}
    for label, rule in methods.items():
        if rule is None:
            laws[label] = q
        else:
            logits = _rule_logits(rule, rows, p, q, values, known, floor, lse, settings)
            laws[label] = np.asarray(emitted_distribution(rule.at_slot(0), p, q, logits=logits), dtype=np.float64)
    rng = np.random.default_rng(seed)
    count = len(rows)
    problem, by, grade, log_probs = [], [], [], {label: [] for label in methods}
    for label in [ALONE, *(r.describe() for r in drawn)]:
        law = laws[label]
        cumulative = np.cumsum(law, axis=-1)
        token = (cumulative < (rng.random(count) * cumulative[:, -1])[:, None]).sum(-1)
        problem += list(range(count))
        by += [label] * count
        grade += correct[np.arange(count), token].astype(float).tolist()
        for other, other_law in laws.items():
            with np.errstate(divide="ignore"):
                log_probs[other] += np.log(other_law[np.arange(count), token]).tolist()
    pooled = pooled_accuracy(
        problem,
        by,
        grade,
        {k: np.minimum(np.asarray(v), 0.0) for k, v in log_probs.items()},
        [k for k in methods if k != ALONE],
        n_boot=n_boot,
        seed=seed,
        alpha=alpha,
        min_ess=min_ess,
    )
    exact = summarize_exact(rescore_exact(records, drawn + asked, settings=settings), n_boot=n_boot, seed=seed).pooled()
    agree = {
        r.method: bool(r.difference_lo - 1e-12 <= exact[r.method]["difference"] <= r.difference_hi + 1e-12)
        for r in pooled
    }
    return {"pooled": pooled, "exact": exact, "agree": agree}
