"""The one interface every decoder implements (``Decoder``): a ``DecodeSpec``, a verifier and a drafter in;
``steps(prompts_ids, seeds, eos_ids)`` a generator of steps (it yields between steps, so several decoders can
alternate on one machine: ``interleave``) whose value is one ``DecodeResult`` per prompt; ``generate`` the
same run to its end. The implementations: ``HostChain`` and ``HostBatch`` (``_host_decode``), ``OnDevice``
(``_device_decode``); ``_decoders.decoder_for`` picks one."""

from __future__ import annotations

import abc

from ._clock import drain

__all__ = ["Decoder"]


class Decoder(abc.ABC):
    """Decodes prompts under one ``spec`` with ``verifier`` (a model) and ``draft`` (a model, an
    ``NgramDrafter``, or None for the verifier alone). Each prompt is decoded with its own seed (the
    generators of its draws), so its tokens do not depend on the prompts beside it."""

    def __init__(self, spec, verifier, draft=None):
        if spec.rule is not None:
            if draft is None:
                raise ValueError(f"{spec.label} needs a drafter: give a draft model or an NgramDrafter")
            spec.check_drafter(draft)
        self.spec, self.verifier, self.draft = spec, verifier, draft

    def steps(self, prompts_ids, seeds, eos_ids=()):
        """A generator of steps whose value is one ``DecodeResult`` per prompt of ``prompts_ids`` (lists of
        token ids, each decoded with its seed of ``seeds``)."""
        prompts_ids, seeds = [list(x) for x in prompts_ids], list(seeds)
        if not prompts_ids or len(prompts_ids) != len(seeds):
            raise ValueError(
                f"give one seed per prompt, and at least one prompt; got {len(prompts_ids)} prompt(s) and "
                f"{len(seeds)} seed(s)"
            )
        if any(len(ids) < 1 for ids in prompts_ids):
            raise ValueError("every prompt's ids must hold at least one token")
        return (yield from self._run(prompts_ids, seeds, set(eos_ids)))

    @abc.abstractmethod
    def _run(self, prompts_ids, seeds, eos_ids):
        """``steps`` once its arguments are checked."""

    def generate(self, prompts_ids, seeds, eos_ids=()) -> list:
        """``steps`` run to its end: one ``DecodeResult`` per prompt."""
        return drain(self.steps(prompts_ids, seeds, eos_ids))
