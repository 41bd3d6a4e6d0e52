"""One implementation for NumPy and torch: a tiny array-namespace helper (like POT's ``nx``).

``namespace(*arrays)`` returns the backend of the arrays (NumPy when none is a torch tensor)
and refuses to mix them. Backends expose only the handful of operations the rules need,
allocate on the inputs' device, and keep the inputs' floating dtype; low-precision inputs
(float16 / bfloat16) are computed in float32 by ``promote`` and cast back by the caller.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NumpyBackend", "TorchBackend", "namespace"]


def _is_torch(x) -> bool:
    mod = type(x).__module__
    return mod.startswith("torch") and type(x).__name__ == "Tensor"


class NumpyBackend:
    name = "numpy"

    @staticmethod
    def asarray(x, like=None, dtype=None):
        if dtype is None and like is not None:
            dtype = like.dtype
        return np.asarray(x, dtype=dtype)

    @staticmethod
    def is_floating(x) -> bool:
        return np.issubdtype(np.asarray(x).dtype, np.floating)

    @staticmethod
    def is_integer(x) -> bool:
        return np.issubdtype(np.asarray(x).dtype, np.integer)

    @staticmethod
    def eps(x) -> float:
        return float(np.finfo(x.dtype).eps) if np.issubdtype(x.dtype, np.floating) else 0.0

    @staticmethod
    def promote(x):
        """float64 stays, float32 stays, float16 -> float32; anything else -> float64."""
        x = np.asarray(x)
        if x.dtype in (np.float64, np.float32):
            return x
        if x.dtype == np.float16:
            return x.astype(np.float32)
        return x.astype(np.float64)

    @staticmethod
    def cast(x, like):
        return np.asarray(x).astype(np.asarray(like).dtype, copy=False)

    @staticmethod
    def take_last(x, index):
        """x[..., index] with one index per row (index has x's leading shape)."""
        return np.take_along_axis(x, np.asarray(index)[..., None], axis=-1)[..., 0]

    @staticmethod
    def put_last(x, index, values):
        """Copy of x with x[..., index] = values, one index per row."""
        out = np.array(x, copy=True)
        np.put_along_axis(out, np.asarray(index)[..., None], np.asarray(values, dtype=out.dtype)[..., None], axis=-1)
        return out

    @staticmethod
    def put_last_(x, index, values):
        """x[..., index] = values in place (one index per row); returns x."""
        np.put_along_axis(x, np.asarray(index)[..., None], np.asarray(values, dtype=x.dtype)[..., None], axis=-1)
        return x

    @staticmethod
    def sum_last(x, keepdims=False):
        return np.sum(x, axis=-1, keepdims=keepdims)

    @staticmethod
    def argmax_last(x):
        return np.argmax(x, axis=-1)

    @staticmethod
    def sort_desc_last(x):
        """(values, indices) sorted in decreasing order along the last axis (stable)."""
        idx = np.argsort(-x, axis=-1, kind="stable")
        return np.take_along_axis(x, idx, axis=-1), idx

    @staticmethod
    def cumsum_last(x):
        return np.cumsum(x, axis=-1)

    @staticmethod
    def mask_to(cond, like):
        """A boolean mask as 0.0 / 1.0 in the dtype of ``like``."""
        return np.asarray(cond).astype(np.asarray(like).dtype)

    @staticmethod
    def scatter_last(values, idx):
        """out[..., idx[..., j]] = values[..., j] (inverse of a permutation gather)."""
        out = np.empty_like(values)
        np.put_along_axis(out, idx, values, axis=-1)
        return out

    @staticmethod
    def max_last(x, keepdims=False):
        return np.max(x, axis=-1, keepdims=keepdims)

    @staticmethod
    def topk_threshold(x, k):
        """The k-th largest value of each row (ties kept), shape (...)."""
        k = min(k, x.shape[-1])
        return np.partition(x, x.shape[-1] - k, axis=-1)[..., x.shape[-1] - k]

    @staticmethod
    def min_all(x):
        return np.min(x) if np.size(x) else np.inf

    @staticmethod
    def positive_part_of_difference(a, b):
        """max(a - b, 0) as a new array, in two in-place passes."""
        out = np.subtract(a, b)
        np.maximum(out, 0.0, out=out)
        return out

    @staticmethod
    def divide_rows_(x, z):
        """x /= z (z shaped (..., 1)), in place; returns x."""
        x /= z
        return x

    where = staticmethod(np.where)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    clip = staticmethod(np.clip)
    isnan = staticmethod(np.isnan)
    isfinite = staticmethod(np.isfinite)
    log = staticmethod(np.log)
    exp = staticmethod(np.exp)
    sqrt = staticmethod(np.sqrt)
    abs = staticmethod(np.abs)

    @staticmethod
    def broadcast_to(x, shape):
        return np.broadcast_to(x, shape)

    @staticmethod
    def shape(x):
        return tuple(np.shape(x))

    @staticmethod
    def reshape(x, shape):
        return np.reshape(x, shape)

    @staticmethod
    def flatnonzero(x):
        """Indices of the true entries of a 1-D mask, increasing."""
        return np.flatnonzero(x)

    @staticmethod
    def any(x) -> bool:
        return bool(np.any(x))

    @staticmethod
    def to_numpy(x):
        return np.asarray(x)


class TorchBackend:
    name = "torch"

    def __init__(self):
        # torch is the module of the tensors given: it is imported already (by the caller), so the
        # backend takes it from there; the package itself imports torch only in its models wing
        import sys

        self.torch = sys.modules["torch"]

    def asarray(self, x, like=None, dtype=None):
        t = self.torch
        device = like.device if like is not None and _is_torch(like) else None
        if dtype is None and like is not None and _is_torch(like):
            dtype = like.dtype
        if _is_torch(x):
            return x.to(device=device if device is not None else x.device, dtype=dtype or x.dtype)
        return t.as_tensor(np.asarray(x), device=device, dtype=dtype)

    def is_floating(self, x) -> bool:
        return bool(self.torch.is_floating_point(self.asarray(x)))

    def is_integer(self, x) -> bool:
        x = self.asarray(x)
        return not self.torch.is_floating_point(x) and not self.torch.is_complex(x) and x.dtype != self.torch.bool

    def eps(self, x) -> float:
        return float(self.torch.finfo(x.dtype).eps) if self.torch.is_floating_point(x) else 0.0

    def promote(self, x):
        t = self.torch
        x = self.asarray(x)
        if x.dtype in (t.float64, t.float32):
            return x
        if x.dtype in (t.float16, t.bfloat16):
            return x.to(t.float32)
        return x.to(t.float64)

    def cast(self, x, like):
        return x.to(like.dtype)

    def take_last(self, x, index):
        index = self.asarray(index, like=None).to(device=x.device, dtype=self.torch.int64)
        index = index.expand(x.shape[:-1]) if index.dim() < x.dim() - 1 else index
        return self.torch.gather(x, -1, index.unsqueeze(-1)).squeeze(-1)

    def put_last(self, x, index, values):
        return self.put_last_(x.clone(), index, values)

    def put_last_(self, x, index, values):
        index = self.asarray(index).to(device=x.device, dtype=self.torch.int64)
        index = index.expand(x.shape[:-1]) if index.dim() < x.dim() - 1 else index
        if _is_number(values):  # a Python number goes to the kernel as an argument: no copy to the device
            return x.scatter_(-1, index.unsqueeze(-1), _py(values))
        values = self.asarray(values, like=x).expand(x.shape[:-1])
        return x.scatter_(-1, index.unsqueeze(-1), values.unsqueeze(-1))

    def sum_last(self, x, keepdims=False):
        return x.sum(dim=-1, keepdim=keepdims)

    def argmax_last(self, x):
        return x.argmax(dim=-1)

    def sort_desc_last(self, x):
        values, idx = self.torch.sort(x, dim=-1, descending=True, stable=True)
        return values, idx

    def cumsum_last(self, x):
        return self.torch.cumsum(x, dim=-1)

    def mask_to(self, cond, like):
        return cond.to(like.dtype)

    def scatter_last(self, values, idx):
        return self.torch.empty_like(values).scatter(-1, idx, values)

    def max_last(self, x, keepdims=False):
        return x.max(dim=-1, keepdim=keepdims).values

    def topk_threshold(self, x, k):
        k = min(k, x.shape[-1])
        return self.torch.topk(x, k, dim=-1).values[..., -1]

    def min_all(self, x):
        return x.min() if x.numel() else float("inf")

    def positive_part_of_difference(self, a, b):
        return self.torch.sub(a, b).clamp_(min=0.0)

    def divide_rows_(self, x, z):
        return x.div_(z)

    def where(self, cond, a, b):
        """torch.where; a Python number goes to the kernel as an argument (a tensor made of it would
        be a copy to the device, which waits for the device's queued work)."""
        if not _is_torch(a) and not _is_torch(b) and _is_number(a) and _is_number(b):
            return self.torch.where(cond, _py(a), _py(b))  # two numbers: the default dtype, on cond's device
        ref = a if _is_torch(a) else b if _is_torch(b) else cond
        scalar = ref.dtype.is_floating_point  # a number beside a float tensor: its dtype decides
        a = a if _is_torch(a) else _py(a) if scalar and _is_number(a) else self.asarray(a, like=ref)
        b = b if _is_torch(b) else _py(b) if scalar and _is_number(b) else self.asarray(b, like=ref)
        return self.torch.where(cond, a, b)

    def minimum(self, a, b):
        if _is_number(b) and a.dtype.is_floating_point:
            return self.torch.clamp(a, max=_py(b))
        return self.torch.minimum(a, self.asarray(b, like=a))

    def maximum(self, a, b):
        if _is_number(b) and a.dtype.is_floating_point:
            return self.torch.clamp(a, min=_py(b))
        return self.torch.maximum(a, self.asarray(b, like=a))

    def clip(self, x, lo, hi):
        return self.torch.clamp(x, lo, hi)

    def isnan(self, x):
        return self.torch.isnan(x)

    def isfinite(self, x):
        return self.torch.isfinite(x)

    def log(self, x):
        return self.torch.log(x)

    def exp(self, x):
        return self.torch.exp(x)

    def sqrt(self, x):
        return self.torch.sqrt(x)

    def abs(self, x):
        return self.torch.abs(x)

    def broadcast_to(self, x, shape):
        return self.asarray(x).expand(shape)

    @staticmethod
    def shape(x):
        return tuple(x.shape)

    @staticmethod
    def reshape(x, shape):
        return x.reshape(shape)

    def flatnonzero(self, x):
        return self.torch.nonzero(x).flatten()

    @staticmethod
    def any(x) -> bool:
        return bool(x.any())

    def to_numpy(self, x):
        if x.dtype in (self.torch.bfloat16, self.torch.float16):
            x = x.to(self.torch.float32)
        return x.detach().cpu().numpy()


def _is_number(x) -> bool:
    """A Python or NumPy real number (not an array, not a bool array)."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _py(x):
    """A number as a Python int or float (torch takes those as kernel arguments)."""
    return int(x) if isinstance(x, (int, np.integer)) else float(x)


_NUMPY = NumpyBackend()
_TORCH = None


def namespace(*arrays):
    """The backend shared by ``arrays`` (None entries ignored); mixing NumPy and torch raises."""
    global _TORCH
    kinds = {_is_torch(a) for a in arrays if a is not None and not np.isscalar(a)}
    if kinds == {True, False}:
        raise ValueError(
            "arguments mix NumPy arrays and torch tensors; pass all of them as one kind "
            "(e.g. torch.as_tensor(x) or x.cpu().numpy())"
        )
    if True in kinds:
        if _TORCH is None:
            _TORCH = TorchBackend()
        return _TORCH
    return _NUMPY
