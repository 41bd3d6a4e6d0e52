"""Which decoder runs a spec for a pair (``decoder_for``): the choice in one place.

- ``HostChain``: llama.cpp at batch 1 (one sequence, rows on the host: what ``speculative_generate`` runs);
- ``OnDevice``: the Hugging Face engine where the spec allows it (``OnDevice.ready``: a token rule, the
  verifier's bonus, no gate, drafting policy, drift record or raw logits; and the verifier alone), rows on the
  model's device, one host synchronisation a step;
- ``HostBatch``: every other case (llama.cpp batches, and the Hugging Face engine under the other options).
"""

from __future__ import annotations

from ._device_decode import OnDevice
from ._hf import engine_of
from ._host_decode import HostBatch, HostChain

__all__ = ["HostBatch", "HostChain", "OnDevice", "batched_decoder", "decoder_for"]


def _check_engines(verifier, draft):
    """One engine for both models (the n-gram drafter has none)."""
    from ._drafters import NgramDrafter

    if draft is None or isinstance(draft, NgramDrafter):
        return
    engines = {engine_of(verifier), engine_of(draft)}
    if len(engines) > 1:
        raise ValueError(f"the verifier and the draft run on different engines ({sorted(engines)}): load both on one")


def batched_decoder(spec, verifier, draft=None):
    """The decoder of a batch of prompts: ``OnDevice`` where it is ready, else ``HostBatch``."""
    _check_engines(verifier, draft)
    if OnDevice.ready(spec, verifier, draft):
        return OnDevice(spec, verifier, draft)
    if spec.static_cache or spec.fuse_rule:
        raise ValueError(
            "static_cache / cuda_graphs / fuse_rule run in the Hugging Face engine's device decoder, which takes the "
            "verifier alone or a token rule with the verifier's bonus and no gate, drafting policy, drift record or "
            "raw logits: drop static_cache / fuse_rule, or those options"
        )
    return HostBatch(spec, verifier, draft)


def decoder_for(spec, verifier, draft=None, *, batch=None):
    """The decoder of ``spec`` for this pair at ``batch`` prompts a call (default: the spec's): ``HostChain``
    on llama.cpp at batch 1, else ``batched_decoder``'s choice (see the module docstring)."""
    batch = spec.batch if batch is None else batch
    _check_engines(verifier, draft)
    if batch == 1 and engine_of(verifier) == "llama.cpp" and not (spec.static_cache or spec.fuse_rule):
        return HostChain(spec, verifier, draft)
    return batched_decoder(spec, verifier, draft)
