"""Traces from files of logits (.npz, .npy, torch .pt): ``import_logits``."""

from __future__ import annotations

import os

import numpy as np

from .._data._trace_format import TraceError
from .._data._trace_import import trace_from_arrays

__all__ = ["import_logits"]


def import_logits(path, directory, **kwargs):
    """Trace from a file of logits: ``.npz`` or torch ``.pt`` with keys draft_logits,
    target_logits, tokens (and optionally sequence_lengths), or ``.npy`` of shape (2, N, V)
    ([draft, target]) with ``tokens=`` given."""
    ext = os.path.splitext(str(path))[1].lower()
    if ext in (".npz", ".npy"):
        try:
            loaded = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            kind = "a NumPy .npz archive of arrays" if ext == ".npz" else "a NumPy .npy array"
            raise TraceError(
                f"{path}: not {kind} ({type(exc).__name__}); pickled objects are never loaded: save the logits with "
                "numpy.savez (or numpy.save) of plain arrays"
            ) from None
    if ext == ".npz":
        if not hasattr(loaded, "files"):
            raise TraceError(f"{path}: a .npy array saved under a .npz name: save the arrays with numpy.savez")
        with loaded as data:
            arrays = {k: data[k] for k in data.files}
    elif ext == ".pt":
        import torch

        arrays = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(arrays, dict):
            raise TraceError(f"{path}: expected a dict of tensors with draft_logits, target_logits, tokens")
    elif ext == ".npy":
        both = loaded
        if hasattr(both, "files"):
            raise TraceError(f"{path}: an .npz archive saved under a .npy name: rename it to .npz")
        if both.ndim != 3 or both.shape[0] != 2:
            raise TraceError(f"{path}: a .npy import must be (2, positions, V) = [draft, target]; got {both.shape}")
        arrays = {"draft_logits": both[0], "target_logits": both[1], "tokens": kwargs.pop("tokens")}
    else:
        raise TraceError(f"{path}: unsupported extension {ext!r} (use .npz, .npy or .pt)")
    missing = {"draft_logits", "target_logits", "tokens"} - set(arrays)
    if missing:
        raise TraceError(f"{path}: missing {sorted(missing)}")
    lengths = arrays.get("sequence_lengths")
    if lengths is not None:
        lengths = [int(x) for x in np.asarray(lengths)]
    return trace_from_arrays(
        directory, arrays["draft_logits"], arrays["target_logits"], arrays["tokens"], sequence_lengths=lengths, **kwargs
    )
