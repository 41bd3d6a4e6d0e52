"""A rule's torch path compiled (``FusedRule``): ``acceptance_and_correction`` of a decoder's own rows traced
once per shape and dtype by ``torch.compile`` into fused kernels (C++ on the CPU, Triton on CUDA), so a
decoding step launches a few kernels for the rule instead of one per elementwise operation.

The rows are not validated (they are the decoder's processed rows: a validated call reads its checks back,
which a compiled graph cannot); a row with no residual mass is repaired without a branch (both values
computed, one kept), where the eager path repairs it after the call. The results equal the rule's eager path
up to the reassociation the compiler may make in sums, within the rule's own tolerance
(``tests/models/test_fused.py`` checks them against the NumPy law)."""

from __future__ import annotations

from .._rules._registry import as_rule

__all__ = ["FusedRule", "fused"]


class FusedRule:
    """``rule``'s ``acceptance_and_correction`` compiled; ``at_slot(j)`` compiled per slot; ``describe`` as the
    rule's. ``mode``: ``torch.compile``'s (None, "max-autotune-no-cudagraphs", ...). A rule that reads raw
    logits is refused (its logits come from the caller's own processing)."""

    def __init__(self, rule, *, mode=None):
        import torch

        self.rule = as_rule(rule)
        if self.rule.needs_logits:
            raise ValueError(
                f"{self.rule.describe()} reads raw logits ({', '.join(sorted(self.rule.needs_logits))}): its torch "
                "path is not fused here; run it eagerly"
            )
        self.mode = mode
        self._compiled = torch.compile(self._call, dynamic=False, mode=mode)
        self._slots = {}

    def _call(self, draft_probs, target_probs, drafted_token):
        return self.rule.acceptance_and_correction(draft_probs, target_probs, drafted_token, validate=False)

    def acceptance_and_correction(self, draft_probs, target_probs, drafted_token, *, validate=False, pending=None):
        """(acceptance, correction) as the rule's, compiled. ``validate`` must be False (see the module
        docstring); ``pending`` is not used (nothing is read back)."""
        if validate:
            raise ValueError("a fused rule does not validate its rows: call the rule itself with validate=True")
        return self._compiled(draft_probs, target_probs, drafted_token)

    def at_slot(self, slot):
        """The rule at block slot ``slot``, fused (compiled once per slot)."""
        if slot not in self._slots:
            self._slots[slot] = FusedRule(self.rule.at_slot(slot), mode=self.mode)
        return self._slots[slot]

    def describe(self):
        return self.rule.describe()

    def __getattr__(self, name):  # what the decoders read of a rule (needs_logits, draft_count, ...)
        if name == "rule":
            raise AttributeError(name)
        return getattr(self.rule, name)


_FUSED = {}


def fused(rule, mode=None) -> FusedRule:
    """The ``FusedRule`` of ``rule`` (one per rule and mode in a process: its compiled graphs are kept)."""
    rule = as_rule(rule)
    key = (type(rule), rule.describe(), mode)
    if key not in _FUSED:
        _FUSED[key] = FusedRule(rule, mode=mode)
    return _FUSED[key]
