"""Which decoder runs a decoding spec (``decoder_for``: the choice in one place), and the public functions of
real speculative decoding with any acceptance rule and of the verifier alone, each a ``DecodeSpec`` built and
checked once and then the decoder chosen here:

- ``HostChain`` (``_host_loop``): one sequence, rows on the host (``speculative_generate``,
  ``autoregressive_generate``; llama.cpp at batch 1);
- ``OnDevice`` (``_device_loop``): B prompts on the Hugging Face engine where the spec allows it
  (``OnDevice.ready``: a token rule, the verifier's bonus, no gate, drafting policy, drift record or raw
  logits; and the verifier alone), rows on the model's device, one host synchronisation a step;
- ``HostBatch`` (``_host_loop``): every other batch (llama.cpp batches, and the Hugging Face engine under the
  other options).

Each ``*_steps`` function is the same run as a generator of steps (``interleave`` alternates several on one
machine). Both distributions are processed with the same sampling settings and chain (temperature, top-k,
top-p, min-p) before the rule sees them, as in vLLM and the paper; temperature 0 is greedy. The options of a
speculative call (``bonus_policy``, ``draft_mode``, ``draft_policy``, ``gate``, ``drift``) are
``DecodeSpec``'s, written there once.
"""

from __future__ import annotations

from ._clock import drain
from ._decode_spec import DecodeResult, DecodeSpec, check_chain_rule, device_only_refusal
from ._device_loop import OnDevice
from ._drafters import NgramDrafter
from ._hf import engine_of
from ._host_loop import HostBatch, HostChain

__all__ = [
    "DecodeResult",
    "HostBatch",
    "HostChain",
    "NgramDrafter",
    "OnDevice",
    "autoregressive_batch_steps",
    "autoregressive_generate",
    "autoregressive_generate_batch",
    "autoregressive_steps",
    "batched_decoder",
    "chain_decoder",
    "check_chain_rule",
    "decoder_for",
    "speculative_batch_steps",
    "speculative_generate",
    "speculative_generate_batch",
    "speculative_steps",
]

#: The options of a speculative call beside its positional arguments: ``DecodeSpec``'s fields of those names.
OPTIONS = ("bonus_policy", "draft_mode", "draft_policy", "gate", "drift")


def _check_engines(verifier, draft):
    """One engine for both models (the n-gram drafter has none)."""
    if draft is None or isinstance(draft, NgramDrafter):
        return
    engines = {engine_of(verifier), engine_of(draft)}
    if len(engines) > 1:
        raise ValueError(f"the verifier and the draft run on different engines ({sorted(engines)}): load both on one")


def chain_decoder(spec, verifier, draft=None):
    """The decoder of one sequence on the host (``HostChain``), on either engine."""
    _check_engines(verifier, draft)
    return HostChain(spec, verifier, draft)


def batched_decoder(spec, verifier, draft=None, *, device=True):
    """The decoder of a batch of prompts: ``OnDevice`` where it is ready (and ``device``), else ``HostBatch``."""
    _check_engines(verifier, draft)
    if device and OnDevice.ready(spec, verifier, draft):
        return OnDevice(spec, verifier, draft)
    if spec.static_cache or spec.fuse_rule:
        raise device_only_refusal(spec)
    return HostBatch(spec, verifier, draft)


def decoder_for(spec, verifier, draft=None, *, batch=None):
    """The decoder of ``spec`` for this pair at ``batch`` prompts a call (default: the spec's): ``HostChain``
    on llama.cpp at batch 1, else ``batched_decoder``'s choice (see the module docstring)."""
    batch = spec.batch if batch is None else batch
    if batch == 1 and engine_of(verifier) == "llama.cpp" and not (spec.static_cache or spec.fuse_rule):
        return chain_decoder(spec, verifier, draft)
    return batched_decoder(spec, verifier, draft)


def _spec(rule, m, sampling, max_new_tokens, options) -> DecodeSpec:
    """The spec of a call's arguments (the public functions' signatures), checked once; ``options`` may hold
    ``OPTIONS`` only."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown decoding option(s) {unknown}; the options are {', '.join(OPTIONS)}")
    return DecodeSpec(rule=rule, m=m, settings=sampling, max_new_tokens=max_new_tokens, **options)


def _one(steps):
    """A batch decoder's steps for one prompt: its one result as the value."""
    results = yield from steps
    return results[0]


def autoregressive_steps(model, prompt_ids, sampling=None, max_new_tokens=128, seed=0, eos_ids=()):
    """``autoregressive_generate`` as a generator of steps (one per token; ``interleave`` runs
    several in alternation); its value is the ``DecodeResult``, timed by the run's own clock."""
    spec = _spec(None, 1, sampling, max_new_tokens, {})
    return (yield from _one(chain_decoder(spec, model).steps([prompt_ids], [seed], eos_ids)))


def autoregressive_generate(model, prompt_ids, sampling=None, max_new_tokens=128, seed=0, eos_ids=()):
    """The verifier alone: the baseline for accuracy and wall time (the same sampling loop as the dumper)."""
    return drain(autoregressive_steps(model, prompt_ids, sampling, max_new_tokens, seed, eos_ids))


def speculative_generate(
    verifier, draft, rule, m, sampling=None, max_new_tokens=128, seed=0, prompt_ids=(), eos_ids=(), **options
):
    """Speculative decoding of ``prompt_ids`` with ``rule``; ``draft`` is a causal LM or an ``NgramDrafter``.

    Per step: draft m tokens (sampling from the processed draft distribution p), verify them in
    one forward pass of the verifier (processed q), accept in order with the rule's acceptance
    probability (the draft at slot j judged by ``rule.at_slot(j)``), sample the rule's
    correction token after the first rejection, or a bonus token when all m are accepted: from
    q (``bonus_policy="verifier"``) or, under ``"relaxed"``, by one more step of the rule with
    the drafter's distribution at the bonus position (one extra draft forward pass; needs a
    draft model). Rules that need raw logits get both models' full rows. A block rule
    (``block``) judges the m drafts at once: the number accepted and the token after them are
    drawn from its ``block_law`` (the verifier's bonus policy only). ``draft_mode="greedy"``
    drafts argmax p, and the rule sees p one-hot (an MTP head or EAGLE drafter). Multi-draft
    rules (trees) are refused: decoding here drafts chains. ``draft_policy`` (``"p-min(0.4)"``,
    ``"entropy(1)"``, ``"accept-prob(0.3)"``) stops a block early when the drafter is unsure, as
    ``policy_blocks`` models it (the stop reads p at one more place: one more draft forward).
    ``gate`` (``RegionGate``, ``FunctionGate``, a callable or "OPEN:CLOSE"): gated relaxation, a
    relaxed token rule judges a draft only where the gate is open after the tokens generated
    before it (the output so far and the drafts before it in the block), the gate's lossless
    fallback (SpS) elsewhere. ``drift=True`` records, per emitted token, KL(pi_t || q_t): pi_t the
    exact law the rule emits that position from (``emitted_distribution`` of the rule that judged
    it, over the draft there; q at a verifier bonus), q_t the verifier's processed row there; their
    sum along the output (``DecodeResult.answer_kl``) is an unbiased estimate of E[sum_t KL(pi_t ||
    q_t)], which bounds the KL of the whole answer's law from the verifier's from above (the chain
    rule over the tokens and the block's hidden accept decisions, then the data processing
    inequality; equal to 0 for a lossless rule). Token rules only (a block rule's law at a slot
    depends on drafts not yet drawn). The options (``bonus_policy``, ``draft_mode``, ``draft_policy``,
    ``gate``, ``drift``) are ``DecodeSpec``'s.
    Returns a ``DecodeResult`` with timings (the prefill apart, and when each token was out). ``speculative_steps`` is
    the same run as a generator of steps.
    """
    return drain(
        speculative_steps(verifier, draft, rule, m, sampling, max_new_tokens, seed, prompt_ids, eos_ids, **options)
    )


def speculative_steps(
    verifier, draft, rule, m, sampling=None, max_new_tokens=128, seed=0, prompt_ids=(), eos_ids=(), **options
):
    """``speculative_generate`` as a generator that yields after the prefill and after each
    verification step, so several runs (the verifier alone among them) can alternate on one
    machine (``interleave``); its value is the ``DecodeResult``, timed by the run's own clock
    (``OwnClock``: the chunks of the other runs are not counted)."""
    spec = _spec(rule, m, sampling, max_new_tokens, options)
    return (yield from _one(chain_decoder(spec, verifier, draft).steps([prompt_ids], [seed], eos_ids)))


def speculative_batch_steps(
    verifier, draft, rule, m, prompts_ids, seeds, sampling=None, max_new_tokens=128, eos_ids=(), **options
):
    """Speculative decoding of B prompts at once, as a generator of steps (``interleave`` alternates
    it with other runs); its value is one ``DecodeResult`` per prompt. On the Hugging Face engine,
    where the options allow (``OnDevice.ready``: a token rule, the verifier's bonus, no gate, drafting
    policy, drift record or raw logits), the rows stay on the device (``OnDevice``: one host
    synchronisation a step, each request's own random streams); otherwise, and on llama.cpp, on the
    host (``HostBatch``).

    The B requests advance in synchronous steps. A step drafts up to m tokens for every request
    that is still running, one draft forward of all of them per drafted position (a request whose
    drafting policy stopped it drops out of the later ones), then verifies every request's block in
    one verifier evaluation of sum_b (m_b + 1) tokens, each at its own positions (``llama_decode``
    with one sequence id per request); each request is judged by the rule exactly as
    ``speculative_steps`` judges it, with its own generators seeded by ``seeds[b]``, accepts its
    own length, and its caches are cut back to its accepted prefix (``llama_memory_seq_rm``, or
    the slot's length). A
    request that ends (an end-of-sequence token, or ``max_new_tokens``) leaves the batch. So
    request b's tokens are those ``speculative_generate`` gives with the same seed whenever the
    logits agree (they do up to llama.cpp's rounding in batches of another shape).

    Timing: ``prefill_seconds`` is the batch's prefill (every prompt in one evaluation of each
    model), ``token_seconds`` when each token was out, ``total_seconds`` the request's own latency
    (the batch's clock when it ended); ``draft_seconds`` / ``verify_seconds`` the batch's steps
    while it ran. Options as in ``speculative_generate``."""
    spec = _spec(rule, m, sampling, max_new_tokens, options)
    return (yield from batched_decoder(spec, verifier, draft).steps(prompts_ids, seeds, eos_ids))


def speculative_generate_batch(
    verifier, draft, rule, m, prompts_ids, seeds, sampling=None, max_new_tokens=128, eos_ids=(), **options
):
    """Speculative decoding of B prompts at once: one ``DecodeResult`` per prompt
    (``speculative_batch_steps`` run to its end; options as there)."""
    return drain(
        speculative_batch_steps(
            verifier, draft, rule, m, prompts_ids, seeds, sampling, max_new_tokens, eos_ids, **options
        )
    )


def autoregressive_generate_batch(model, prompts_ids, seeds, sampling=None, max_new_tokens=128, eos_ids=()):
    """The verifier alone on B prompts at once: ``autoregressive_batch_steps`` run to its end."""
    return drain(autoregressive_batch_steps(model, prompts_ids, seeds, sampling, max_new_tokens, eos_ids))


def autoregressive_batch_steps(model, prompts_ids, seeds, sampling=None, max_new_tokens=128, eos_ids=()):
    """The verifier alone on B prompts at once: one evaluation of every running request's next token
    per step; on llama.cpp each sampled as ``generate`` samples it (its own generator, seeded by
    ``seeds[b]``), on the Hugging Face engine on the device with the dumper's streams
    (``device_autoregressive_steps``); a generator of steps whose value is one ``DecodeResult`` per
    prompt, timed as ``speculative_batch_steps`` times them."""
    spec = _spec(None, 1, sampling, max_new_tokens, {})
    return (yield from batched_decoder(spec, model).steps(prompts_ids, seeds, eos_ids))
