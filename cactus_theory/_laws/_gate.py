"""Gated relaxation: a relaxed rule only inside a region of the output (TensorRT-LLM applies its
relaxed acceptance only in the thinking phase; vLLM PR 45229), the lossless rule elsewhere.

A gate says, for each position, whether the token there is judged by the relaxed rule: from the
tokens emitted before it (token-id markers that open and close a region, ``RegionGate``, e.g.
``<think>`` ... ``</think>``), or from a user function of those tokens (``FunctionGate``). The
analysis (``analyze_trace(gate=...)``), the simulator (``simulate(region=...)``), the planner and
real decoding (``speculative_generate(gate=...)``) accept one; a gated rule is the rule where the
gate is open and ``fallback`` (SpS) where it is closed, position by position. Lossless rules are
never gated (they already are what the fallback is for)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._math._validation import is_integer
from .._rules import judgement_of, make_rule

__all__ = ["FunctionGate", "RegionGate", "fallback_for", "gated_rule", "make_gate"]


def _ids(value, name):
    values = (value,) if is_integer(value) else tuple(value)
    if not values or any(not is_integer(v) or v < 0 for v in values):
        raise ValueError(f"{name} must be one or more token ids (integers >= 0); got {value!r}")
    return tuple(int(v) for v in values)


def _check_fallback(fallback):
    rule = make_rule(fallback) if isinstance(fallback, str) else fallback
    if not getattr(rule, "lossless", False) or not judgement_of(rule).per_token:
        raise ValueError(f"a gate's fallback must be a lossless token rule (sps, strict); got {fallback!r}")
    return rule


@dataclass(frozen=True)
class RegionGate:
    """Open after any of ``open_ids`` and closed after any of ``close_ids`` (the marker itself is
    judged in the state before it: the opening marker by the fallback, the closing one by the
    relaxed rule); ``start_inside``: the state before the first generated token (True when the
    prompt ends inside the region, e.g. a chat template that opens ``<think>``). ``fallback``:
    the lossless rule where the gate is closed.

    Examples
    --------
    >>> RegionGate(open_ids=(7,), close_ids=(8,)).mask([1, 7, 2, 3, 8, 4])
    array([False, False,  True,  True,  True, False])
    """

    open_ids: tuple
    close_ids: tuple
    start_inside: bool = False
    fallback: str = "sps"

    def __post_init__(self):
        object.__setattr__(self, "open_ids", _ids(self.open_ids, "open_ids"))
        object.__setattr__(self, "close_ids", _ids(self.close_ids, "close_ids"))
        if set(self.open_ids) & set(self.close_ids):
            raise ValueError(
                f"a token cannot both open and close the region: {sorted(set(self.open_ids) & set(self.close_ids))}"
            )
        if not isinstance(self.start_inside, (bool, np.bool_)):
            raise ValueError(f"start_inside must be True or False; got {self.start_inside!r}")
        _check_fallback(self.fallback)

    def describe(self) -> str:
        ids = ";".join
        start = ", start=inside" if self.start_inside else ""
        fallback = "" if self.fallback == "sps" else f", fallback={self.fallback}"
        return f"region(open={ids(map(str, self.open_ids))}, close={ids(map(str, self.close_ids))}{start}{fallback})"

    def inside_after(self, tokens, inside=None) -> bool:
        """The state after ``tokens``, from ``inside`` (default ``start_inside``)."""
        state = self.start_inside if inside is None else bool(inside)
        for token in tokens:
            if token in self.open_ids:
                state = True
            elif token in self.close_ids:
                state = False
        return state

    def mask(self, tokens, inside=None) -> np.ndarray:
        """(T,) bool: the state before each of ``tokens`` (True: the relaxed rule judges it)."""
        tokens = np.asarray(tokens).reshape(-1)
        event = np.zeros(tokens.size, dtype=np.int8)  # +1 opens, -1 closes, after the token
        event[np.isin(tokens, self.open_ids)] = 1
        event[np.isin(tokens, self.close_ids)] = -1
        start = self.start_inside if inside is None else bool(inside)
        last = np.where(event != 0, np.arange(tokens.size), -1)
        last = np.maximum.accumulate(last) if tokens.size else last
        before = np.concatenate([[-1], last[:-1]]) if tokens.size else last
        return np.where(before >= 0, event[np.maximum(before, 0)] > 0, start)


@dataclass(frozen=True)
class FunctionGate:
    """A user's gate: ``inside(previous_tokens) -> bool`` for the token after ``previous_tokens``
    (the generated tokens before it, a list of ints); ``label`` names it in tables.
    ``start``: tokens taken as coming before the first generated one (e.g. the prompt's end)."""

    inside: Callable
    label: str = "function"
    start: tuple = ()
    fallback: str = "sps"

    def __post_init__(self):
        if not callable(self.inside):
            raise ValueError(f"FunctionGate needs a callable inside(previous_tokens) -> bool; got {self.inside!r}")
        _check_fallback(self.fallback)

    def describe(self) -> str:
        return f"function({self.label})"

    def inside_after(self, tokens, inside=None) -> bool:
        return bool(self.inside([*self.start, *(int(t) for t in tokens)]))

    def mask(self, tokens, inside=None) -> np.ndarray:
        tokens = [int(t) for t in np.asarray(tokens).reshape(-1)]
        return np.array([bool(self.inside([*self.start, *tokens[:t]])) for t in range(len(tokens))], dtype=bool)


def make_gate(gate):
    """A gate from a ``RegionGate`` / ``FunctionGate``, a callable (``FunctionGate``), None (no
    gate) or a string "OPEN:CLOSE" / "OPEN:CLOSE:inside" of token ids (several joined by ";"), as
    the CLI's ``--gate`` takes it."""
    if gate is None or isinstance(gate, (RegionGate, FunctionGate)):
        return gate
    if callable(gate):
        return FunctionGate(gate)
    if isinstance(gate, str):
        parts = gate.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("inside", "outside")):
            raise ValueError(
                f"a gate is OPEN:CLOSE or OPEN:CLOSE:inside (token ids, several joined by ';'); got {gate!r}"
            )
        try:
            opens, closes = ([int(x) for x in part.split(";")] for part in parts[:2])
        except ValueError:
            raise ValueError(f"a gate's markers are token ids (integers); got {gate!r}") from None
        return RegionGate(tuple(opens), tuple(closes), start_inside=len(parts) == 3 and parts[2] == "inside")
    raise ValueError(f"gate must be a RegionGate, a FunctionGate, a callable, 'OPEN:CLOSE' or None; got {gate!r}")


def gated_rule(gate, rule):
    """The fallback of ``gate`` for ``rule``, or None where the rule is not gated (no gate, or a
    lossless rule); a gate on a block, multi-draft or slot-dependent rule is refused."""
    return None if gate is None else fallback_for(rule, gate.fallback)


def fallback_for(rule, fallback="sps"):
    """The lossless rule that judges where a gate is closed, for ``rule``: None if ``rule`` is
    itself lossless (not gated); a block, multi-draft or slot-dependent rule is refused (a gate
    switches rules position by position)."""
    if rule.lossless:
        return None
    judgement = judgement_of(rule)
    if not judgement.per_token or judgement.slot_dependent:
        raise ValueError(
            f"a gate switches rules position by position: {rule.describe()} judges "
            + ("whole blocks or several drafts" if not judgement.per_token else "by block slot")
            + "; gate a token rule"
        )
    return _check_fallback(fallback)
