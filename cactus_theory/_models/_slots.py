"""Several sequences in one Hugging Face forward: a causal LM with ``sequences`` slots in one
preallocated KV cache (``SlotModel``), the interface of a llama.cpp model (``sequence`` /
``evaluate``), so the dumper, batched decoding and the calibration take either engine.

Each slot has its own length; a forward feeds several slots at once, each at its own positions
(``position_ids``), with an explicit attention mask (a slot attends to its own cached prefix and
causally within the new tokens) and the new keys and values written into the slots' rows of the
cache (``_SlotCache.update``). Inputs are padded on the left to the longest request; a padding
token attends to one cached column, writes to a scratch column that no real token ever reads, and
its output is dropped. Cropping a slot only moves its length (stale entries beyond it are masked,
then overwritten).

Shapes decide the rounding. A row's float32 results depend on its own inputs and on the shapes of
the products it takes part in (rows, tokens, attended columns), not on the values in the other
rows (checked in ``tests/models/test_slots.py``). ``fixed_span=True`` attends every row over the
whole capacity, and ``forward_rows(..., all_slots=True)`` runs every slot (free ones as padding), so
a decoding step has one shape whatever sequences share it: what the dumper needs to resume to the
same bits.
"""

from __future__ import annotations

import functools
import inspect
import weakref

from .._math._validation import check_int

__all__ = ["GRAPH_KINDS", "SlotModel", "SlotSequence", "to_device"]

#: How a fixed-span model's all-slot forwards run: eagerly (None), through CUDA graphs captured once per
#: shape ("cuda"), or through the CPU stand-in of a graph (``"emulate"``: the same buffers, replayed by running
#: the forward again on them; what the tests check the buffers' plumbing with).
GRAPH_KINDS = (None, "cuda", "emulate")


def to_device(torch, values, device, dtype=None):
    """``values`` (nested lists of numbers) as a tensor on ``device`` (int64 by default) without a
    synchronisation: a blocking copy to an accelerator waits for all the work queued on it, and so
    can an asynchronous one from pageable memory (it waits for a staging buffer that the copies
    queued before it still hold), so the small per-step tensors (positions, slots, seeds) go from
    pinned memory (PyTorch's caching host allocator), asynchronously."""
    out = torch.tensor(values, dtype=dtype or torch.int64)
    if torch.device(device).type == "cpu":
        return out
    try:
        out = out.pin_memory()
    except RuntimeError:  # no pinned memory on this platform: a pageable copy
        pass
    return out.to(device, non_blocking=True)


_ATTENTION = "cactus_slots"
_REGISTERED = []


def _slot_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention over a slot cache: one ``scaled_dot_product_attention`` call with the explicit mask and
    the key-value heads shared by their query heads inside the call (``enable_gqa``), where the stock
    path copies them once per query head first."""
    import torch

    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
    )
    return out.transpose(1, 2).contiguous(), None


def _registered() -> bool:
    """Register ``_slot_attention`` with transformers (once); False where it cannot be (old versions)."""
    if not _REGISTERED:
        try:
            import torch
            from transformers import AttentionInterface

            if "enable_gqa" not in (torch.nn.functional.scaled_dot_product_attention.__doc__ or ""):
                raise TypeError("no enable_gqa (torch < 2.5)")
            AttentionInterface.register(_ATTENTION, _slot_attention)
            _REGISTERED.append(True)
        except (ImportError, TypeError, ValueError, AttributeError):
            _REGISTERED.append(False)
    return _REGISTERED[0]


def _capture(torch, kind, body):
    """(replay, out): ``body`` (a forward reading only buffers that stay put) captured once. ``"cuda"``: warmed
    up twice on a side stream, as PyTorch asks before a capture, then captured into a CUDA graph with its own
    memory pool (graphs replayed in any order must not share one); ``out`` is the graph's output buffer.
    ``"emulate"``: replay runs ``body`` again and copies its result into the first result's buffer, so a forward
    that read anything but its own input buffers gives other logits than the eager path (the tests' check).
    The warm-up writes the step's keys and values where the replay writes them again: the same values."""
    if kind == "emulate":
        out = body()
        return (lambda: out.copy_(body())), out
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = body()
    return graph.replay, out


class _attention:
    """Within the block, ``config`` runs ``_slot_attention`` (sdpa and eager models; restored after)."""

    def __init__(self, config):
        self.config, self.before = config, None

    def __enter__(self):
        current = getattr(self.config, "_attn_implementation", None)
        if current in (None, "sdpa", "eager") and _registered():
            self.before = current
            self.config._attn_implementation = _ATTENTION
        return self

    def __exit__(self, *exc):
        if self.before is not None or getattr(self.config, "_attn_implementation", None) == _ATTENTION:
            self.config._attn_implementation = self.before
        return False


@functools.cache
def _keyword(model_class, names):
    """The first of ``names`` that ``model_class.forward`` takes, else None."""
    params = inspect.signature(model_class.forward).parameters
    return next((n for n in names if n in params), None)


def _slot_cache_class():
    """The cache class (built on first use: transformers is imported only then)."""
    from transformers.cache_utils import Cache

    class _SlotCache(Cache):
        """The model's view of a ``SlotModel``'s buffers during one forward: ``update`` writes the new
        keys and values at the slots' positions and returns the rows' whole attended span."""

        def __init__(self, owner):  # the base class's own state is not used: every method is ours
            self.owner = owner
            self.layers = []

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            return self.owner._update(key_states, value_states, layer_idx)

        def get_seq_length(self, layer_idx=0):
            return 0

        def get_mask_sizes(self, *args, **kwargs):  # pragma: no cover - the mask is given in 4-D
            raise RuntimeError("the slot cache takes an explicit attention mask")

        @property
        def is_compileable(self):
            return False

        def __len__(self):
            return len(self.owner._keys)

    return _SlotCache


class SlotSequence:
    """One slot of a ``SlotModel``: a KV cache over a growing token list, with the interface of
    ``_hf.CachedModel`` and ``LlamaSequence`` (``feed``, ``crop``, ``length``, ``close``)."""

    def __init__(self, owner, slot):
        self.owner, self.slot = owner, slot
        self._finalizer = weakref.finalize(self, owner._give_back, slot)

    @property
    def length(self) -> int:
        """Tokens in this slot's cache."""
        return self.owner._lengths[self.slot]

    @property
    def seq_id(self):
        return self.slot

    def feed(self, tokens, want="all"):
        """Run the model on ``tokens`` after the cached prefix: raw logits, float32 on the model's
        device, (len, V) (``want="last"``: (1, V))."""
        return self.owner.evaluate([(self, tokens, want)])[0]

    def crop(self, length):
        """Keep the first ``length`` cached tokens (the rest is masked, then overwritten)."""
        self.owner._lengths[self.slot] = min(self.length, int(length))

    def close(self):
        self._finalizer()


class SlotModel:
    """A Hugging Face causal LM with ``sequences`` slots of one KV cache, ``context`` tokens each (it
    grows when a slot needs more, unless ``fixed_span``). ``config``, ``generation_config`` and
    ``vocab_size`` read as the model's. ``fixed_span``: every row attends over the whole capacity
    (one shape for every step; see the module docstring)."""

    engine = "hf"

    def __init__(self, model, sequences, *, context=256, fixed_span=False, pad_token=0, graphs=None):
        for name, value, low in (("sequences", sequences, 1), ("context", context, 1)):
            check_int(value, name, low)
        if graphs not in GRAPH_KINDS:
            raise ValueError(f"graphs must be one of {GRAPH_KINDS}; got {graphs!r}")
        if graphs is not None and not fixed_span:
            raise ValueError("graphs need fixed_span=True: a captured forward has one shape")
        implementation = str(getattr(model.config, "_attn_implementation", None) or "")
        if "flash" in implementation or "flex" in implementation:
            raise ValueError(
                f"the model runs attention with {implementation!r}, which takes no explicit mask: load it with "
                "attn_implementation='sdpa' (the default) or 'eager' to run several sequences at once"
            )
        kinds = set(getattr(model.config, "layer_types", None) or ["full_attention"])
        if kinds - {"full_attention"} or getattr(model.config, "use_sliding_window", False):
            raise ValueError(
                f"the model has attention layers of kinds {sorted(kinds)} (a sliding window): several sequences at "
                "once run full-attention models only here; dump or decode it with batch 1"
            )
        import torch

        self.model, self.torch = model, torch
        weight = next(model.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        if graphs == "cuda" and self.device.type != "cuda":
            raise ValueError(
                f"graphs='cuda' captures CUDA graphs: the model is on {self.device}; move it to a CUDA device, or "
                "run without graphs (fixed_span alone gives the static shapes)"
            )
        self.graphs, self._graph_entries = graphs, {}
        self.sequences, self.capacity = int(sequences), int(context)
        self.fixed_span, self.pad_token = bool(fixed_span), int(pad_token)
        self.config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        self.vocab_size = int(model.config.vocab_size)
        self._keys, self._values = [], []
        self._free = list(range(self.sequences))
        self._lengths = [0] * self.sequences
        self._cache = _slot_cache_class()(self)
        self._cache_kw = _keyword(type(model), ("cache", "past_key_values"))
        self._keep_kw = _keyword(type(model), ("logits_to_keep", "num_logits_to_keep"))
        self._step = None  # (rows, write positions, span, all slots?) of the forward running
        self._heads = None

    # -- slots ----------------------------------------------------------------------------------
    def sequence(self) -> SlotSequence:
        """A fresh slot (an empty cache): the lowest free one; a ValueError when all are in use."""
        if not self._free:
            raise ValueError(
                f"all {self.sequences} sequences of this model are in use: make the SlotModel with more "
                "sequences, or close some"
            )
        slot = min(self._free)
        self._free.remove(slot)
        self._lengths[slot] = 0
        return SlotSequence(self, slot)

    def _give_back(self, slot):
        self._lengths[slot] = 0
        self._free.append(slot)

    def reserve(self, length):
        """Make every slot hold at least ``length`` tokens (a no-op when it does)."""
        if length <= self.capacity:
            return
        if self.fixed_span and self._keys:
            raise ValueError(
                f"a slot needs {length} tokens, more than the fixed span of {self.capacity}: make the "
                "SlotModel with context >= the longest prompt plus the tokens it generates"
            )
        grown = max(int(length), 2 * self.capacity)
        for store in (self._keys, self._values):
            for i, old in enumerate(store):
                new = old.new_zeros((*old.shape[:2], grown + 1, old.shape[3]))
                new[:, :, : self.capacity] = old[:, :, : self.capacity]
                store[i] = new
        self.capacity = grown

    def close(self):
        """Free the cache buffers (and the captured graphs) now."""
        self._keys, self._values, self._graph_entries = [], [], {}

    # -- forwards -------------------------------------------------------------------------------
    def _update(self, key_states, value_states, layer):
        """Write a layer's new keys and values at the running forward's positions; return the rows'
        attended keys and values, (rows, heads, span, head_dim)."""
        rows, where, span, every = self._step
        if layer == len(self._keys):  # the first forward allocates: the heads and widths the model uses
            torch = self.torch
            shape = (self.sequences, key_states.shape[1], self.capacity + 1, key_states.shape[-1])
            self._keys.append(torch.zeros(shape, dtype=key_states.dtype, device=key_states.device))
            self._values.append(torch.zeros(shape, dtype=value_states.dtype, device=value_states.device))
        if self._heads is None or self._heads.shape[1] != key_states.shape[1]:
            self._heads = self.torch.arange(key_states.shape[1], device=key_states.device)[None, :, None]
        index = (rows, self._heads, where)  # (R, 1, 1), (1, H, 1), (R, 1, T): every new entry at once
        keys, values = self._keys[layer], self._values[layer]
        keys.index_put_(index, key_states)
        values.index_put_(index, value_states)
        if every:
            return keys[:, :, :span], values[:, :, :span]
        flat = rows[:, 0, 0]
        return keys.index_select(0, flat)[:, :, :span], values.index_select(0, flat)[:, :, :span]

    def forward_rows(self, slots, input_ids, counts, want="last", *, all_slots=False):
        """One forward of the token rows ``input_ids`` (R, T) (a tensor on the model's device,
        left-padded: row r's ``counts[r]`` tokens are its last) after the cached prefixes of
        ``slots`` (R slot numbers). Returns raw logits in the model's dtype: (R, V) for
        ``want="last"`` (each row's last token), else (R, T, V). ``all_slots``: the rows are every
        slot in order (free slots with a count of 0: padding alone), so the cache is attended in
        place. Advances the slots' lengths. Nothing waits for the device: the small index tensors
        go to it without a synchronisation (``to_device``)."""
        torch = self.torch
        rows_n, width = input_ids.shape
        if len(slots) != rows_n or len(counts) != rows_n:
            raise ValueError(f"forward_rows: {len(slots)} slots and {len(counts)} counts for {rows_n} rows")
        lengths = [self._lengths[s] for s in slots]
        needed = max(a + c for a, c in zip(lengths, counts, strict=True))
        self.reserve(needed)
        span = self.capacity if self.fixed_span else max(needed, 1)
        packed = to_device(
            torch,
            [[a - (width - c) for a, c in zip(lengths, counts, strict=True)], [width - c for c in counts], list(slots)],
            self.device,
        )
        every = all_slots and list(slots) == list(range(self.sequences))
        if self.graphs is not None and every:
            logits = self._replayed(input_ids, packed, span, want)
        else:
            logits = self._forward_packed(input_ids, packed, span, want, every)
        for s, c in zip(slots, counts, strict=True):
            self._lengths[s] += c
        return logits

    def _forward_packed(self, input_ids, packed, span, want, every):
        """The forward of ``forward_rows`` from its device inputs alone: the token rows and ``packed``
        (3, R): each row's first position, its padding, its slot. What a captured graph replays."""
        torch = self.torch
        width = input_ids.shape[1]
        column = torch.arange(width, device=self.device)
        real = column[None, :] >= packed[1][:, None]
        positions = torch.where(real, packed[0][:, None] + column[None, :], 0)
        where = torch.where(real, positions, self.capacity)  # padding writes to the scratch column
        visible = torch.arange(span, device=self.device)[None, None, :] <= positions[:, :, None]
        mask = ((~visible).to(self.dtype) * torch.finfo(self.dtype).min)[:, None]  # 0 where seen, else the lowest
        kwargs = {
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": positions,
            "use_cache": True,
            self._cache_kw: self._cache,
        }
        if self._keep_kw is not None and want == "last":
            kwargs[self._keep_kw] = 1
        self._step = (packed[2][:, None, None], where[:, None, :], span, every)
        try:
            with torch.no_grad(), _attention(self.model.config):
                logits = self.model(**kwargs).logits
        finally:
            self._step = None
        return logits[:, -1] if want == "last" else logits

    def _replayed(self, input_ids, packed, span, want):
        """``_forward_packed`` of every slot through a graph captured once per shape (rows are every slot:
        the shape is the tokens a row and ``want``): the inputs copied into the graph's own buffers, the
        graph replayed, its output buffer returned (valid until the next forward of that shape)."""
        key = (int(input_ids.shape[1]), want)
        entry = self._graph_entries.get(key)
        if entry is None:
            inputs = (input_ids.clone(), packed.clone())
            replay, out = _capture(self.torch, self.graphs, lambda: self._forward_packed(*inputs, span, want, True))
            entry = self._graph_entries[key] = (replay, inputs, out)
        replay, (ids_in, packed_in), out = entry
        ids_in.copy_(input_ids)
        packed_in.copy_(packed)
        replay()
        return out

    def evaluate(self, requests):
        """Feed several slots at once: ``requests`` is a list of (``SlotSequence``, tokens, want), tokens
        a list of ids or a 1-D tensor, want "all" or "last". One forward (the inputs padded on the
        left). Returns per request raw logits, float32 on the model's device: (len, V), or (1, V)
        for "last" ((0, V) for no tokens)."""
        torch = self.torch
        for seq, _, want in requests:
            if seq.owner is not self:
                raise ValueError("a sequence of another model was given to evaluate")
            if want not in ("all", "last"):
                raise ValueError(f"want must be 'all' or 'last'; got {want!r}")
        counts = [len(t) for _, t, _ in requests]
        out = [None] * len(requests)
        live = [i for i, c in enumerate(counts) if c > 0]
        for i in set(range(len(requests))) - set(live):
            out[i] = torch.zeros((0, self.vocab_size), device=self.device)
        if not live:
            return out
        width = max(counts[i] for i in live)
        if all(not hasattr(requests[i][1], "to") for i in live):  # lists: one copy to the device
            ids = to_device(
                torch,
                [[self.pad_token] * (width - counts[i]) + [int(t) for t in requests[i][1]] for i in live],
                self.device,
            )
        else:
            ids = torch.full((len(live), width), self.pad_token, dtype=torch.int64, device=self.device)
            for r, i in enumerate(live):
                tokens = requests[i][1]
                ids[r, width - counts[i] :] = (
                    tokens.to(self.device)
                    if hasattr(tokens, "to")
                    else to_device(torch, [int(t) for t in tokens], self.device)
                )
        wants = "all" if any(requests[i][2] == "all" for i in live) else "last"
        slots = [requests[i][0].slot for i in live]
        logits = self.forward_rows(slots, ids, [counts[i] for i in live], wants)
        for r, i in enumerate(live):
            want = requests[i][2]
            if wants == "last":
                out[i] = logits[r : r + 1].float()
            else:
                out[i] = logits[r, width - (1 if want == "last" else counts[i]) :].float()
        return out
