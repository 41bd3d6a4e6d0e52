"""The acceptance-rule protocol, the rule registry and the generalised speculative sampling family.

A rule acts at one position, batched over leading axes. Given the draft distribution p
(``draft_probs``, or None for a drafter without probabilities: one-hot on the drafted token),
the verifier distribution q (``target_probs``) and the drafted token n, it gives

- ``acceptance``: the probability of accepting n,
- ``correction``: the distribution sampled after a rejection (``acceptance_and_correction``
  gives both with the inputs checked once),
- ``bonus_distribution``: the law of the bonus token after m accepted drafts, under a bonus
  policy: ``"verifier"`` (q, the default and vLLM's ``target_p``) or ``"relaxed"`` (the bonus
  position passes the rule once more, so its law is the rule's emitted law there: the overlay's
  ``relaxed_T_qp``),
- ``emitted``: the exact distribution of the token emitted at one position, marginalised over
  n ~ p (Hao & Mou, ICLR 2026, Theorem 3; ``emitted_distribution``).

Rules that need the logits from before the sampling processing (temperature, top-k, top-p)
receive them as ``logits=RuleLogits(...)``; one that needs them and gets none raises.

Generalised speculative sampling (Leviathan et al., ICML 2023; docs: Theory) covers most rules:
a surrogate h, the distribution the rule accepts towards in place of the target q (which may
depend on n, and need not be normalised) gives acceptance min(1, h(n)/p(n)) and correction
norm(max(0, h - p)). A drafted token with p(n) = 0 (never proposed by a drafter with these
probabilities) is accepted iff h(n) > 0, the limit of min(1, h(n)/p(n)) as p(n) -> 0; every rule
rejects a token that both models exclude (p(n) = q(n) = 0). The overlay's kernel rejects every
p(n) = 0 token; the two conventions give the same emitted law (such tokens have weight p(n) = 0).

Rules are frozen dataclasses: hashable, comparable, checked when built. Each class registers
itself under its ``name`` when it is defined (``_registry``); ``make_rule("cactus(delta=1)")``
builds one from a spec string and ``available_rules()`` lists them. How to write one:
docs/contributing/rules.md ("Adding a rule").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._backend import namespace
from .._math._validation import Pending, check_distribution
from . import _spec as grammar
from ._helpers import (
    NUMPY,
    ROLES,
    block_inputs,
    gss_emitted,
    prefix_product_law,
    prepare,
    prepare_logits,
    ratio_acceptance,
    ratio_acceptance_host,
    residual,
    slot_logits,
)
from ._reference import emitted_bruteforce

__all__ = [
    "BONUS_POLICIES",
    "JUDGED",
    "RULE_KINDS",
    "BlockLaw",
    "GeneralizedRule",
    "Judgement",
    "Rule",
    "judgement_of",
    "kind_of",
    "on_rule_defined",
]

BONUS_POLICIES = ("verifier", "relaxed")


# --- raw logits --------------------------------------------------------------------------------


# --- input preparation -------------------------------------------------------------------------


# --- the protocol ------------------------------------------------------------------------------


#: Named rule classes in the order they were defined, and the callables told of each (the registry's:
#: ``on_rule_defined``). The protocol knows nothing of the registry: it only announces its subclasses.
_DEFINED: list = []
_HOOKS: list = []


def on_rule_defined(hook) -> None:
    """Call ``hook(cls)`` for every named Rule subclass, those defined already first, then each new one."""
    _HOOKS.append(hook)
    for cls in list(_DEFINED):
        hook(cls)


@dataclass(frozen=True)
class Rule:
    """Base of every acceptance rule (see the module docstring for the protocol)."""

    #: The emitted distribution equals q exactly, for every p.
    lossless: ClassVar[bool] = False
    #: Acceptance is 0 or 1 given (p, q, n): no coin is flipped.
    deterministic: ClassVar[bool] = False
    #: Spec name: the class registers itself under it when defined (None: not registered).
    name: ClassVar[str | None] = None
    #: Other spec names with some parameters fixed, e.g. {"cactus-exact": {"bonus": "exact"}}.
    aliases: ClassVar[dict] = {}
    #: Parameters always shown by ``describe`` (others only when not at their default).
    label_fields: ClassVar[tuple | None] = None
    #: Acceptance depends on the draft's place in the block (``at_slot``).
    slot_dependent: ClassVar[bool] = False
    #: The torch path computes the vocabulary-wide parts in the input's dtype (float16 / bfloat16
    #: rows are not copied to float32; row sums and per-row scalars are still float32 or float64).
    keeps_input_precision: ClassVar[bool] = False
    #: Parameter settings the conformance suite tests (besides the defaults).
    examples: ClassVar[tuple] = ()
    #: Where the rule comes from: the paper (authors, title, venue) and/or the code base
    #: (repository @ commit, file), as the docs' rules table and the rule's page show it.
    reference: ClassVar[str] = ""
    #: The rules table's cells in plain text: {"acceptance", "correction", "emitted", "lossless"}.
    table: ClassVar[dict] = {}
    #: Settings the every-rule comparison runs (the report, ``cactus-theory compare``): tuples
    #: (paper-grid label or "" for a setting of this package's choosing, parameters, bonus policy).
    comparison: ClassVar[tuple] = ()
    #: One-line summaries of the aliases, e.g. {"cactus-exact": "..."} (default: the class's).
    alias_summaries: ClassVar[dict] = {}
    #: The rules table's cells of the aliases (default: the class's ``table``).
    alias_tables: ClassVar[dict] = {}
    #: Spec names of other registered rules this one may equal at some settings on purpose (the
    #: duplicate check of the conformance suite accepts equal laws with these).
    same_law_as: ClassVar[tuple] = ()
    #: What the rule judges (``RULE_KINDS``): "token", a drafted token at a time; "block", a whole
    #: drafted block at once (``block_law``; its per-token methods are its one-draft case, a block of
    #: m = 1); "multi-draft", several drafts per position (``MultiDraftRule``: multi-draft and tree
    #: verification; its per-token methods are its one-draft form, ``single()``). The accepted
    #: length of each kind is computed in one place (``_laws._lengths.accepted_lengths``).
    kind: ClassVar[str] = "token"
    #: What one judgement covers (``JUDGED``): "token", each drafted token in order (token rules,
    #: and multi-draft rules that judge a node's children); "block", the whole drafted block at once;
    #: "tree", the whole drafted tree at once (``traversal-tree``). Default: "block" for a block rule,
    #: "token" otherwise. Every layer asks it through ``judgement_of`` (the one place a rule's kind
    #: is read).
    judges: ClassVar[str | None] = None
    #: The family's settings on the deployment frontier (``plan --quality``): parameter dicts, from the least
    #: to the most relaxed; () where the rule is one setting (it enters at its defaults when named).
    frontier: ClassVar[tuple] = ()
    #: Parameters that take a grid's values when a spec leaves them out (``make_rules``,
    #: ``--delta``): only those with the grid's meaning, e.g. ("delta",) for a divergence budget.
    grid_parameters: ClassVar[tuple] = ()
    #: A plugin rule's colour in figures (any matplotlib colour; ``alias_colours`` per alias), kept
    #: unless a built-in rule of the same figure has it. None: one derived from the rule's name.
    #: The built-in rules' colours are fixed in ``_analysis._plotting.BUILTIN_COLOURS``.
    colour: ClassVar[str | None] = None
    alias_colours: ClassVar[dict] = {}

    @property
    def draft_count(self) -> int:
        """Drafts verified per position: 1, or k for a multi-draft rule (a tree of width k)."""
        return 1

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):  # a named rule class announces itself (the registry listens: ``on_rule_defined``)
            _DEFINED.append(cls)
            for hook in _HOOKS:
                hook(cls)

    # -- what a rule needs ------------------------------------------------------------------
    @property
    def needs_logits(self) -> tuple:
        """Roles ("target", "draft") whose raw logits this rule needs; () for none."""
        return ()

    def at_slot(self, slot: int) -> Rule:
        """The rule applied to the draft at 0-based place ``slot`` of a block (itself, for most rules)."""
        return self

    def _prepare(self, draft_probs, target_probs, drafted_token, logits, validate, pending=None):
        b, p, q, n, ref = prepare(
            draft_probs,
            target_probs,
            drafted_token,
            validate=validate,
            pending=pending,
            promote=not self.keeps_input_precision,
        )
        lg = prepare_logits(b, logits, b.shape(q), self.needs_logits, self.describe())
        return b, p, q, n, lg, ref

    def _host(self, draft_probs, target_probs, logits=None, validate=True):
        """(p, q, logits) as float64 NumPy arrays; torch tensors are copied to the host.

        Rows of a lower precision than float64 (accepted within their dtype's tolerance) are
        renormalised in float64, so that exact computations start from distributions.
        """
        b, p, q, _, ref = prepare(draft_probs, target_probs, None, validate=validate)
        lg = prepare_logits(b, logits, b.shape(q), self.needs_logits, self.describe())
        p = np.asarray(b.to_numpy(p), dtype=np.float64)
        q = np.asarray(b.to_numpy(q), dtype=np.float64)
        if b.eps(ref) > np.finfo(np.float64).eps:
            p = p / np.sum(p, axis=-1, keepdims=True)
            q = q / np.sum(q, axis=-1, keepdims=True)
        if lg is not None and b.name != "numpy":
            changes = {}
            for f in dataclasses.fields(lg):
                value = getattr(lg, f.name)
                if f.name != "temperature" and value is not None:
                    host = np.asarray(b.to_numpy(value))
                    changes[f.name] = host if host.dtype == bool else host.astype(np.float64)
            lg = dataclasses.replace(lg, **changes)
        elif lg is not None:
            lg = dataclasses.replace(
                lg,
                **{r: np.asarray(getattr(lg, r), dtype=np.float64) for r in ROLES if getattr(lg, r) is not None},
            )
        return p, q, lg

    # -- the protocol -----------------------------------------------------------------------
    def acceptance(self, draft_probs, target_probs, drafted_token, *, logits=None, validate=True):
        """Probability of accepting the drafted token, shape (...)."""
        with Pending() as pending:
            b, p, q, n, lg, ref = self._prepare(draft_probs, target_probs, drafted_token, logits, validate, pending)
            a = self._acceptance(b, p, q, n, lg)
            both_exclude = (b.take_last(p, n) <= 0) & (b.take_last(q, n) <= 0)
            out = b.cast(b.where(both_exclude, 0.0, a), ref)
        pending.settle()
        return out

    def correction(self, draft_probs, target_probs, drafted_token, *, logits=None, validate=True):
        """Distribution sampled after rejecting the drafted token, shape (..., V)."""
        with Pending() as pending:
            b, p, q, n, lg, ref = self._prepare(draft_probs, target_probs, drafted_token, logits, validate, pending)
            out = self._correction(b, p, q, n, lg)
        pending.settle()  # a repair acts on the correction in its working dtype
        return b.cast(out, ref)

    def acceptance_and_correction(
        self, draft_probs, target_probs, drafted_token, *, logits=None, validate=True, pending=None
    ):
        """(``acceptance``, ``correction``) with the inputs checked once: what a serving engine
        needs at each drafted position. Same values as the two calls.

        On an accelerator the checks run on the device and are read back once, when the call's
        work is queued (``_validation.Pending``): no host round trip of their own. ``pending``: a
        caller's collector, which it settles itself (a decoding step reads its flags with the
        step's own copy to the host); the results are final only then."""
        mine = pending is None
        with pending if not mine else Pending() as pending:
            b, p, q, n, lg, ref = self._prepare(draft_probs, target_probs, drafted_token, logits, validate, pending)
            a = self._acceptance(b, p, q, n, lg)
            both_exclude = (b.take_last(p, n) <= 0) & (b.take_last(q, n) <= 0)
            correction = self._correction(b, p, q, n, lg)
        if mine:
            pending.settle()
        return b.cast(b.where(both_exclude, 0.0, a), ref), b.cast(correction, ref)

    def bonus_distribution(self, draft_probs, target_probs, *, policy="verifier", logits=None, validate=True):
        """Law of the bonus token after m accepted drafts, shape (..., V).

        ``policy="verifier"``: q (vLLM's ``target_p``; ``draft_probs`` may be None).
        ``policy="relaxed"``: the bonus position passes the rule once more with the drafter's
        distribution there, so the law is the rule's emitted law ``emitted(p', q')`` (the
        overlay's ``relaxed_T_qp``), computed in float64.
        """
        if policy not in BONUS_POLICIES:
            raise ValueError(f"policy must be one of {BONUS_POLICIES}; got {policy!r}")
        b = namespace(draft_probs, target_probs)
        if policy == "verifier":
            if not validate:
                return target_probs
            if draft_probs is not None:  # not used, but a bad argument is refused wherever it is given
                prepare(draft_probs, target_probs, None)
            return check_distribution(target_probs, "target_probs", backend=b)
        if draft_probs is None:
            raise ValueError("policy='relaxed' needs draft_probs: the drafter's distribution at the bonus position")
        pi = self.emitted(draft_probs, target_probs, logits=logits)
        return pi if b.name == "numpy" else b.asarray(pi, like=b.asarray(target_probs), dtype=b.torch.float64)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """Exact distribution of the token emitted at one position, n ~ p marginalised (NumPy, float64).

        Generic O(V^2) evaluation through the per-token interface; rules with structure
        override it with an O(V) or O(V log V) algorithm.
        """
        return emitted_bruteforce(self, draft_probs, target_probs, logits=logits)

    def acceptance_all(self, draft_probs, target_probs, *, logits=None):
        """a_n for every token n as the drafted one, shape (..., V) (NumPy, float64).

        ``(draft_probs * acceptance_all).sum(-1)`` is the expected acceptance of one draft.
        Generic loop over tokens; rules with structure override ``_acceptance_all`` in O(V).
        """
        p, q, lg = self._host(draft_probs, target_probs, logits)
        with np.errstate(all="ignore"):
            a = self._acceptance_all(p, q, lg)
        return np.where((p <= 0) & (q <= 0), 0.0, a)

    def emitted_and_acceptance_all(self, p, q, *, logits=None, shared=None):
        """(``emitted``, ``acceptance_all``) of validated float64 host arrays, sharing the work
        the two have in common (``step_metrics`` calls it). ``shared``: a dict of work several
        rules share on the same rows (``step_metrics``); rules that share nothing ignore it."""
        return self.emitted(p, q, logits=logits), self.acceptance_all(p, q, logits=logits)

    def _acceptance_all(self, p, q, lg):
        out = np.empty(q.shape)
        for token in range(q.shape[-1]):
            n = np.full(out.shape[:-1], token)
            out[..., token] = self._acceptance(NUMPY, p, q, n, lg)
        return out

    def logits_exact(self, draft_probs, target_probs, *, logits=None):
        """Whether the logits given determine this rule's result exactly, per row, shape (...).

        Always True for rules that need no logits and for full logit rows; on a top-K trace
        a rule may need a logit the trace does not store (see its docstring).
        """
        p, q, lg = self._host(draft_probs, target_probs, logits)
        if lg is None:
            return np.ones(q.shape[:-1], dtype=bool)
        return np.broadcast_to(np.asarray(self._logits_exact(p, q, lg), dtype=bool), q.shape[:-1]).copy()

    def _logits_exact(self, p, q, lg):
        return True

    # -- the block level ------------------------------------------------------------------------
    def block_law(self, draft_probs, target_probs, drafted_tokens, *, logits=None) -> BlockLaw:
        """The law of one verification step of a drafted block: how many drafts it accepts and
        what it emits after them.

        Parameters
        ----------
        draft_probs : array (..., m, V)
            The drafter's distribution at each drafted position (None: one-hot on the drafts).
        target_probs : array (..., m + 1, V)
            The verifier's at each drafted position and at the bonus position.
        drafted_tokens : int array (..., m)
        logits : RuleLogits
            Rows (..., m + 1, V), for the rules that need raw logits (the draft's bonus row is
            not read).

        Returns
        -------
        BlockLaw
            ``accepted`` (..., m + 1): P(tau = i), i = 0..m; ``emitted`` (..., m + 1, V): the law
            of the token emitted after i accepted drafts (the correction at draft i + 1, or, for
            i = m, the bonus token under the verifier policy: q at the bonus position).

        A token rule's law is the prefix product: P(tau = i) = a_1 ... a_i (1 - a_{i+1}), the
        draft at place j judged by ``at_slot(j)``. Exact, float64, NumPy.
        """
        p, q, tokens, lg = block_inputs(self, draft_probs, target_probs, drafted_tokens, logits)
        m = tokens.shape[-1]
        accept = np.empty(tokens.shape)
        emitted = np.empty((*tokens.shape[:-1], m + 1, q.shape[-1]))
        for j in range(m):
            part = slot_logits(lg, j, q.ndim)
            rule = self.at_slot(j)
            a, r = rule.acceptance_and_correction(
                p[..., j, :], q[..., j, :], tokens[..., j], logits=part, validate=False
            )
            accept[..., j] = np.asarray(a, dtype=np.float64)
            emitted[..., j, :] = np.asarray(r, dtype=np.float64)
        emitted[..., m, :] = q[..., m, :]
        return BlockLaw(accepted=prefix_product_law(accept), emitted=emitted)

    # -- to implement ------------------------------------------------------------------------
    def _acceptance(self, b, p, q, n, lg):  # pragma: no cover - abstract
        raise NotImplementedError

    def _correction(self, b, p, q, n, lg):  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:
        """The canonical spec string (``make_rule(rule.describe()) == rule``)."""
        cls = type(self)
        fields = grammar.fields(cls) if dataclasses.is_dataclass(self) else []
        values = {f.name: getattr(self, f.name) for f in fields}
        name, shown = cls.name or cls.__name__.lower(), values
        for alias, fixed in cls.aliases.items():
            if all(grammar.same(values.get(k), v) for k, v in fixed.items()):
                name, shown = alias, {k: v for k, v in values.items() if k not in fixed}
                break
        always = cls.label_fields if cls.label_fields is not None else tuple(f.name for f in fields[:1])
        defaults = {f.name: grammar.default(f) for f in fields}
        args = [
            f"{k}={grammar.format_value(v)}"
            for k, v in shown.items()
            if (k in always and v is not None) or not grammar.same(v, defaults[k])
        ]
        return f"{name}({', '.join(args)})" if args else name

    @property
    def family(self) -> str:
        """The spec name without parameters (aliases included): 'cactus', 'cactus-exact', 'sps', ..."""
        return self.describe().split("(")[0]


@dataclass(frozen=True)
class GeneralizedRule(Rule):
    """Generalised speculative sampling with a surrogate h: accept with min(1, h(n)/p(n)), correct
    from norm(max(0, h - p)). Subclasses give ``_surrogate(b, p, q, n, logits)``;
    ``surrogate_depends_on_token`` says whether h changes with n (Cactus) or not.
    """

    surrogate_depends_on_token: ClassVar[bool] = False

    def surrogate(self, draft_probs, target_probs, drafted_token=None, *, logits=None):
        """The surrogate h this rule plugs into generalised speculative sampling, shape (..., V)."""
        b, p, q, n, lg, ref = self._prepare(draft_probs, target_probs, drafted_token, logits, True)
        if n is None and self.surrogate_depends_on_token:
            raise ValueError(f"{self.describe()}: the surrogate depends on the drafted token; pass drafted_token")
        return b.cast(self._surrogate(b, p, q, n, lg), ref)

    def _surrogate(self, b, p, q, n, lg):  # pragma: no cover - abstract
        raise NotImplementedError

    def _acceptance(self, b, p, q, n, lg):
        h_n = b.promote(b.take_last(self._surrogate(b, p, q, n, lg), n))
        return ratio_acceptance(b, h_n, b.promote(b.take_last(p, n)))

    def _correction(self, b, p, q, n, lg):
        return residual(b, self._surrogate(b, p, q, n, lg), p)

    def _acceptance_all(self, p, q, lg):
        if self.surrogate_depends_on_token:
            return super()._acceptance_all(p, q, lg)
        return ratio_acceptance_host(self._surrogate(NUMPY, p, q, None, lg), p)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """Exact emitted distribution: h does not depend on n, so pi = p a + (1 - sum p a) r. O(V)."""
        if self.surrogate_depends_on_token:
            return super().emitted(draft_probs, target_probs, logits=logits)
        p, q, lg = self._host(draft_probs, target_probs, logits)
        with np.errstate(all="ignore"):
            h = self._surrogate(NUMPY, p, q, None, lg)
            return gss_emitted(h, p)

    def emitted_and_acceptance_all(self, p, q, *, logits=None, shared=None):
        if self.surrogate_depends_on_token:
            return super().emitted_and_acceptance_all(p, q, logits=logits, shared=shared)
        p, q, lg = self._host(p, q, logits, validate=False)
        with np.errstate(all="ignore"):
            h = self._surrogate(NUMPY, p, q, None, lg)  # once, for both
            accept = ratio_acceptance_host(h, p)
            pi = gss_emitted(h, p)
        return pi, np.where((p <= 0) & (q <= 0), 0.0, accept)


@dataclass(frozen=True)
class BlockLaw:
    """One verification step of a drafted block (``Rule.block_law``).

    Attributes
    ----------
    accepted : array (..., m + 1)
        P(tau = i), the probability that exactly i drafts are accepted.
    emitted : array (..., m + 1, V)
        The law of the token emitted after i accepted drafts (index m: the bonus token).
    """

    accepted: np.ndarray
    emitted: np.ndarray

    @property
    def expected_accepted(self):
        """E[tau] given the drafts, shape (...)."""
        return self.accepted @ np.arange(self.accepted.shape[-1], dtype=np.float64)


#: The kinds of rule (``Rule.kind``).
RULE_KINDS = ("token", "block", "multi-draft")
#: What one judgement of a rule covers (``Rule.judges``).
JUDGED = ("token", "block", "tree")


def kind_of(rule) -> str:
    """A rule's kind (``Rule.kind``); "token" for an object implementing only the four-method protocol."""
    return getattr(rule, "kind", "token")


@dataclass(frozen=True)
class Judgement:
    """What a rule's kind means to every layer that runs it: the laws, the analysis, the simulator,
    decoding and the checks ask these facts (``judgement_of``), never the kind's name, so a new kind
    of rule changes this class alone.

    ``kind``: ``Rule.kind``; ``unit``: what one judgement covers (``Rule.judges``); ``slot_dependent``: the
    rule judges each slot of a block by its own law (``Rule.at_slot``), so its laws are computed per slot."""

    kind: str
    unit: str
    slot_dependent: bool = False

    @property
    def per_token(self) -> bool:
        """Each drafted token judged in turn: per-token laws (acceptance, correction, the emitted law
        and its drift) are the rule's own, the bonus position may be relaxed, the rows may stay on the
        device while decoding."""
        return self.unit == "token" and self.kind == "token"

    @property
    def block(self) -> bool:
        """The whole drafted block judged at once (``block_law``; laws per block start)."""
        return self.unit == "block"

    @property
    def tree(self) -> bool:
        """The whole drafted tree judged at once (``tree_survival_for``, Monte Carlo over trees)."""
        return self.unit == "tree"

    @property
    def multi_draft(self) -> bool:
        """Several drafts per position (multi-draft and tree verification)."""
        return self.kind == "multi-draft"

    @property
    def chain(self) -> bool:
        """One draft per position: what real decoding here runs."""
        return not self.multi_draft

    @property
    def token_drift(self) -> bool:
        """A per-token emitted law, so a per-token drift (KL of each emitted token's law): not for a rule
        that judges whole blocks or trees."""
        return self.unit == "token"


def judgement_of(rule) -> Judgement:
    """The ``Judgement`` of a rule (or of any object implementing the four-method protocol: a token rule)."""
    kind = kind_of(rule)
    unit = getattr(rule, "judges", None) or ("block" if kind == "block" else "token")
    if kind not in RULE_KINDS or unit not in JUDGED:
        raise ValueError(f"{type(rule).__name__}: kind {kind!r} / judges {unit!r}: not one of {RULE_KINDS} / {JUDGED}")
    return Judgement(kind, unit, bool(getattr(rule, "slot_dependent", False)))
