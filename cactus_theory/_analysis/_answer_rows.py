"""Quality traces: what the exact referee keeps of each problem so that any token rule, under any sampler chain,
can be scored again from the records alone, without a model.

At the answer position each model's raw logit row is kept as its ``ANSWER_ROWS`` largest logits (token ids and
values, decreasing, ties by the lower id) and the log-sum-exp of the whole row, beside the correct letter's token
ids (``answer_rows``). A chain whose every processed law lies inside the kept tokens (``SamplingSettings
.support_within``: a top-k of at most that many, applied before any top-p; the paper's and the engines' chains
with top-k 20 all are) gives the same probabilities from the kept rows as from the whole ones, so a rule's law of
the answer token, its accuracy, KL and TV come out the same (to the rounding of sums over more or fewer zeros:
within 1e-12, tested for every registered token rule). Rules that read raw logits get them with what a top-K
trace knows (``RuleLogits``: the kept values, the row's log-sum-exp, an upper bound of the rest) and say per row
whether that decides them (``Rule.logits_exact``); where it does not, rescoring refuses.

The logits are float32 (both engines give float32 rows) and are written with 9 significant digits, which read
back to the same float32. A problem's rows take about 2.3 kB of JSON at 64 logits a model (about 1 kB
compressed).
"""

from __future__ import annotations

import math

import numpy as np

from .._math._validation import is_integer

__all__ = [
    "ANSWER_ROWS",
    "SEQUENCE_ROWS",
    "AnswerRows",
    "answer_rows",
    "read_answer_rows",
    "rescored_laws",
    "sequence_log_probs",
    "sequence_rows",
]

#: Logits kept per model at the answer position: a top-k of at most this many is rescored exactly.
ANSWER_ROWS = 64
#: Logits kept per model at each position of a long answer (``sequence_rows``): the paper's and the engines'
#: top-k 20 rescored exactly, at about 0.7 kB of JSON a position (about 0.3 kB compressed).
SEQUENCE_ROWS = 20
_ROLES = ("target", "draft")


def _top(row: np.ndarray, n: int):
    """(ids, values) of the ``n`` largest entries of ``row``, decreasing, ties by the lower id."""
    n = min(int(n), row.shape[-1])
    part = np.argpartition(-row, n - 1)[:n] if n < row.shape[-1] else np.arange(row.shape[-1])
    kth = row[part].min()
    chosen = np.flatnonzero(row >= kth)  # every tie of the n-th, then cut by (value, id)
    order = np.lexsort((chosen, -row[chosen]))[:n]
    ids = chosen[order]
    return ids, row[ids]


def _lse(row: np.ndarray) -> float:
    top = float(np.max(row))
    return float(np.log(np.sum(np.exp(row - top))) + top)


def answer_rows(target_logits, draft_logits, correct_ids, n: int = ANSWER_ROWS) -> dict:
    """The record entry of one problem's answer position (see the module docstring): {"n", "vocab",
    "correct": the correct letter's token ids, "target" / "draft": {"ids", "logits" (float32 values to 9
    significant digits), "lse" (of the whole row, float64)}}. The rows are a model's raw logits there (V,)."""
    out = {"n": int(n), "vocab": int(np.shape(target_logits)[-1]), "correct": sorted(int(i) for i in correct_ids)}
    for role, raw in zip(_ROLES, (target_logits, draft_logits), strict=True):
        row = np.asarray(raw, dtype=np.float64)
        if row.ndim != 1 or not np.all(np.isfinite(row)):
            raise ValueError(f"the {role}'s answer row must be one finite logit row; got shape {row.shape}")
        ids, values = _top(row, n)
        out[role] = {
            "ids": [int(i) for i in ids],
            "logits": [float(f"{float(np.float32(v)):.9g}") for v in values],
            "lse": _lse(row),
        }
    return out


class AnswerRows:
    """One problem's answer rows read back (``read_answer_rows``): per role ``ids`` (int64), ``logits``
    (float64 holding float32 values) and ``lse``; ``correct`` ids, ``n`` and ``vocab``; ``kind`` "logits" (raw
    rows: any chain rescored) or "probabilities" (a processed law only: refused by rescoring)."""

    def __init__(self, entry: dict, where: str):
        self.where = where
        self.kind = "logits"
        if isinstance(entry, dict) and "probs" in (entry.get("target") or {}):
            raise ValueError(
                f"{where}: these rows hold the verifier's processed probabilities, not raw logits: a rule or a chain "
                "cannot be scored again from them (it needs the logits before the sampler); run the referee with "
                "the models"
            )
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: 'rows' must be an object (the answer rows); got {type(entry).__name__}")
        self.n, self.vocab = entry.get("n"), entry.get("vocab")
        if not _whole(self.n, 1) or not _whole(self.vocab, 2):
            raise ValueError(f"{where}: 'rows' needs 'n' and 'vocab', whole numbers (the logits kept, the vocabulary)")
        correct = entry.get("correct")
        if not isinstance(correct, list) or not correct or not all(_whole(i, 0) for i in correct):
            raise ValueError(f"{where}: 'rows' holds no correct letter's token ids ('correct'): rerun the referee")
        self.correct = np.asarray(sorted(set(correct)), dtype=np.int64)
        if self.correct.max() >= self.vocab:
            raise ValueError(f"{where}: a correct letter's id {int(self.correct.max())} is outside the vocabulary")
        self.ids, self.logits, self.lse = {}, {}, {}
        for role in _ROLES:
            self._read(role, entry.get(role))

    def _read(self, role, part):
        where = f"{self.where}: the {role}'s row"
        if not isinstance(part, dict) or not all(k in part for k in ("ids", "logits", "lse")):
            raise ValueError(f"{where} needs 'ids', 'logits' and 'lse'")
        try:
            ids = np.asarray(part["ids"], dtype=np.int64)
            values = np.asarray(part["logits"], dtype=np.float64).astype(np.float32).astype(np.float64)
            lse = float(part["lse"])
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{where}: 'ids' must be integers and 'logits', 'lse' numbers") from None
        if ids.ndim != 1 or ids.shape != values.shape or not 1 <= ids.size <= self.n:
            raise ValueError(f"{where}: 'ids' and 'logits' must be two lists of the same length, 1 to n = {self.n}")
        if ids.min() < 0 or ids.max() >= self.vocab:
            raise ValueError(f"{where} holds ids outside the vocabulary [0, {self.vocab}) (another tokenizer's rows?)")
        if len(set(ids.tolist())) != ids.size:
            raise ValueError(f"{where} lists a token twice")
        if not (np.all(np.isfinite(values)) and math.isfinite(lse)):
            raise ValueError(f"{where} holds a logit or log-sum-exp that is not a finite number (NaN?)")
        if np.any(np.diff(values) > 0):
            raise ValueError(f"{where}: its logits must be in decreasing order (the largest kept)")
        # the kept tokens' mass under the whole row's law is at most 1: exp(logits - lse) sums to <= 1
        head = float(np.log(np.sum(np.exp(values - values[0]))) + values[0])
        if head > lse + 1e-6 * max(1.0, abs(lse)):
            raise ValueError(
                f"{where}: its kept logits hold more than the whole row's mass (log-sum-exp {lse:.6g} below theirs, "
                f"{head:.6g}): not a row of logits"
            )
        self.ids[role], self.logits[role], self.lse[role] = ids, values, lse

    def support(self) -> np.ndarray:
        """The union of both models' kept ids and the correct ones, sorted."""
        return np.unique(np.concatenate([self.ids["target"], self.ids["draft"], self.correct]))

    def kth(self, role, k) -> float:
        """The ``k``-th largest kept logit of ``role`` (None where fewer are kept)."""
        values = self.logits[role]
        return float(values[k - 1]) if k <= values.size else None


def _whole(value, low) -> bool:
    return is_integer(value) and value >= low


def read_answer_rows(entry, where: str = "rows") -> AnswerRows:
    """A record's ``rows`` entry, checked (ids inside the vocabulary and distinct, finite logits in decreasing
    order, a log-sum-exp that bounds them, the correct letter's ids): a ValueError naming ``where`` and what is
    wrong."""
    return AnswerRows(entry, where)


def _confinement(rows: list, settings) -> None:
    """Refuse, in one line, a chain whose processed law may reach past the logits kept: its top-k must keep at
    most the rows' N before any top-p (``support_within``), and every token tied with the k-th must be kept (rows
    that keep their whole vocabulary decide every chain)."""
    kept = min(min(r.logits[role].size for role in _ROLES) for r in rows)
    if rows[0].kind != "logits" or all(r.logits[role].size == r.vocab for r in rows for role in _ROLES):
        return  # whole rows kept: every chain's law is decided by them
    if not settings.support_within(kept):
        raise ValueError(
            f"--chain / sampling {settings.describe()}: its law may keep tokens beyond the {kept} logits the records "
            f"hold per model (it needs a top-k of at most {kept} applied before any top-p): rescoring refused; run "
            "the referee again with the models"
        )
    if settings.greedy:
        return
    k = settings.top_k
    for r in rows:
        for role in _ROLES:
            values = r.logits[role]
            if values.size < r.vocab and values.size > k and values[k - 1] == values[-1]:
                raise ValueError(
                    f"{r.where}: the {role}'s logits tied with its {k}-th reach past the {values.size} kept: the "
                    "top-k set is not decided by the records; rescoring refused"
                )


def _batch(rows: list):
    """Both models' rows of every problem on one padded support (the union of their kept ids and the correct
    ones, sorted by id; padding at the end): (logits (P, S) per role with -inf where a model's logit is not
    kept, the kept masks, the floors, the lse's, the correct mask (P, S))."""
    supports = [r.support() for r in rows]
    width = max(s.size for s in supports)
    count = len(rows)
    values = {role: np.full((count, width), -np.inf) for role in _ROLES}
    known = {role: np.zeros((count, width), dtype=bool) for role in _ROLES}
    floor = {role: np.full(count, -np.inf) for role in _ROLES}
    lse = {role: np.zeros(count) for role in _ROLES}
    correct = np.zeros((count, width), dtype=bool)
    for i, (r, support) in enumerate(zip(rows, supports, strict=True)):
        where = {int(t): j for j, t in enumerate(support)}
        for role in _ROLES:
            cols = [where[int(t)] for t in r.ids[role]]
            values[role][i, cols] = r.logits[role]
            known[role][i, cols] = True
            lse[role][i] = r.lse[role]
            head = float(np.log(np.sum(np.exp(r.logits[role] - r.logits[role][0]))) + r.logits[role][0])
            with np.errstate(divide="ignore"):
                tail = r.lse[role] + np.log(max(-np.expm1(head - r.lse[role]), 0.0))
            floor[role][i] = min(float(r.logits[role][-1]), tail)
        correct[i, [where[int(t)] for t in r.correct]] = True
        known["target"][i, support.size :] = known["draft"][i, support.size :] = True  # padding: no token
    return values, known, floor, lse, correct


def _rule_logits(rule, rows, p, q, values, known, floor, lse, settings):
    """The raw logits a rule that reads them gets from kept rows (``RuleLogits``: the kept values, the
    log-sum-exp, the floor of the rest), None for a rule that reads none; refused in one line where the kept
    logits do not decide the rule (``Rule.logits_exact``)."""
    from .._math._logits import RuleLogits

    if not rule.needs_logits:
        return None
    fields = {"temperature": settings.temperature}
    for role in _ROLES:
        fields[role] = np.where(known[role], values[role], floor[role][:, None])
        fields[f"{role}_known"] = known[role]
        fields[f"{role}_lse"] = lse[role]
        fields[f"{role}_floor"] = floor[role]
    logits = RuleLogits(**fields)
    exact = rule.logits_exact(p, q, logits=logits)
    if not np.all(exact):
        first = rows[int(np.flatnonzero(~exact)[0])].where
        raise ValueError(
            f"{rule.describe()} reads raw logits the records do not keep ({first}): rescoring refused; run "
            "the referee with the models for it"
        )
    return logits


def sequence_rows(target_logits, draft_logits, tokens, n: int = SEQUENCE_ROWS) -> dict:
    """The record entry of a long answer's rows: at every answer position each model's ``n`` largest raw logits
    (ids and float32 values to 9 significant digits, decreasing, ties by the lower id) and the whole row's
    log-sum-exp, by position: {"n", "vocab", "target" / "draft": {"ids": [[...] a position], "logits": [[...]],
    "lse": [...]}}. ``target_logits``, ``draft_logits``: (T, V) raw rows before each of the T ``tokens``."""
    rows = {
        role: np.asarray(raw, dtype=np.float64) for role, raw in zip(_ROLES, (target_logits, draft_logits), strict=True)
    }
    count = len(tokens)
    for role, row in rows.items():
        if row.ndim != 2 or row.shape[0] != count or not np.all(np.isfinite(row)):
            raise ValueError(f"the {role}'s rows must be (T, V) finite logits, one row per answer token ({count})")
    out = {"n": int(n), "vocab": int(rows["target"].shape[-1])}
    for role, row in rows.items():
        part = {"ids": [], "logits": [], "lse": []}
        for t in range(count):
            ids, values = _top(row[t], n)
            part["ids"].append([int(i) for i in ids])
            part["logits"].append([float(f"{float(np.float32(v)):.9g}") for v in values])
            part["lse"].append(_lse(row[t]))
        out[role] = part
    return out


def _position_entries(rows: dict, tokens, where: str) -> list:
    """A long answer's ``sequence_rows`` entry as one ``answer_rows`` entry a position (its ``correct``: the
    answer's token there), each checked by ``read_answer_rows``."""
    if not isinstance(rows, dict) or not all(isinstance(rows.get(r), dict) for r in _ROLES):
        raise ValueError(f"{where}: 'rows' must hold the target's and the draft's rows by position (sequence_rows)")
    count = len(tokens)
    for role in _ROLES:
        if any(
            not isinstance(rows[role].get(k), list) or len(rows[role][k]) != count for k in ("ids", "logits", "lse")
        ):
            raise ValueError(f"{where}: the {role}'s rows must hold ids, logits and lse for each of its {count} tokens")
    return [
        read_answer_rows(
            {
                "n": rows.get("n"),
                "vocab": rows.get("vocab"),
                "correct": [int(y)],
                **{r: {k: rows[r][k][t] for k in ("ids", "logits", "lse")} for r in _ROLES},
            },
            f"{where}, answer position {t}",
        )
        for t, y in enumerate(tokens)
    ]


def sequence_log_probs(rows, tokens, rules, ms, settings, *, bonus_policy="verifier", where="rows") -> dict:
    """{method: log P(answer) at each m of ``ms``}: the exact probability that speculative decoding with each
    rule of ``rules`` (token rules) emits the answer ``tokens``, and the verifier alone's ("verifier alone"), from
    the answer's kept rows (``rows``: a ``sequence_rows`` entry) under ``settings`` (the sampling and its chain),
    without a model (``answer_log_prob`` on the kept support). A chain that may keep more than the logits kept,
    or a rule they do not decide, is refused in one line naming ``where``."""
    from .._laws._answer_law import answer_log_prob
    from .._math._sampling import processed_probs
    from .._rules._registry import as_rule

    tokens = [int(t) for t in tokens]
    if not tokens:
        raise ValueError(f"{where}: an answer of no tokens has no rows")
    entries = _position_entries(rows, tokens, where)
    _confinement(entries, settings)
    values, known, floor, lse, correct = _batch(entries)
    q = processed_probs(values["target"], settings)
    p = processed_probs(values["draft"], settings)
    at = correct.argmax(-1)
    out = {"verifier alone": np.full(len(ms), answer_log_prob(None, p, q, at, 1))}
    for rule in (as_rule(r) for r in rules):
        logits = _rule_logits(rule, entries, p, q, values, known, floor, lse, settings)
        out[rule.describe()] = np.asarray(
            answer_log_prob(rule, p, q, at, list(ms), bonus_policy=bonus_policy, logits=logits)
        )
    return out


def rescored_laws(rows: list, rules, settings) -> dict:
    """{method: {"accuracy", "kl", "tv"} arrays over the problems of ``rows`` (``AnswerRows``)}: the verifier
    alone ("verifier alone") and each rule of ``rules``, from the kept rows alone under ``settings`` (the
    sampling and its chain), batched over the problems. The same values the referee computes from the whole
    rows (to 1e-12: see the module docstring); a chain that may reach past the kept logits, or a rule the kept
    logits do not decide (``Rule.logits_exact``), is refused in one line."""
    from .._laws._emitted import emitted_distribution
    from .._math._sampling import processed_probs
    from .._rules._protocol import judgement_of

    if not rows:
        raise ValueError("records: no problem's answer rows to rescore")
    _confinement(rows, settings)
    values, known, floor, lse, correct = _batch(rows)
    q = processed_probs(values["target"], settings)
    p = processed_probs(values["draft"], settings)
    zero = np.zeros(len(rows))
    out = {"verifier alone": {"accuracy": np.where(correct, q, 0.0).sum(-1), "kl": zero, "tv": zero}}
    out["verifier alone"]["p_correct"] = np.where(correct, p, 0.0).sum(-1)
    for rule in rules:
        if not judgement_of(rule).per_token:
            raise ValueError(f"{rule.describe()} judges whole blocks or several drafts: rescoring needs a token rule")
        logits = _rule_logits(rule, rows, p, q, values, known, floor, lse, settings)
        pi = np.asarray(emitted_distribution(rule.at_slot(0), p, q, logits=logits), dtype=np.float64)
        support = pi > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(support, pi * (np.log(np.where(support, pi, 1.0)) - np.log(q)), 0.0)
        out[rule.describe()] = {
            "accuracy": np.where(correct, pi, 0.0).sum(-1),
            "kl": np.maximum(terms.sum(-1), 0.0),  # never negative (rounding below 0 of a lossless law)
            "tv": 0.5 * np.abs(pi - q).sum(-1),
        }
    return out
