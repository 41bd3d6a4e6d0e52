"""Input checks shared by every public entry point.

Each check names the argument, quotes the offending value and states the accepted range,
so a user never gets a silent NaN back.
"""

from __future__ import annotations

import contextvars

import numpy as np

__all__ = [
    "Pending",
    "as_delta",
    "as_probability",
    "broadcast",
    "check_distribution",
    "check_int",
    "check_token",
    "host_probabilities",
    "is_integer",
]

#: Default tolerance on |sum - 1| for a probability vector (float64 inputs).
NORMALISATION_ATOL = 1e-6
_EPS32 = float(np.finfo(np.float32).eps)
_EPS64 = float(np.finfo(np.float64).eps)


def normalisation_tolerance(eps: float, vocab: int, atol: float = NORMALISATION_ATOL) -> float:
    """Tolerance on |row sum - 1| for probabilities stored with machine epsilon ``eps``:

        max(atol, 4 eps + 4 eps_w sqrt(V)),   eps_w = eps(float32) below float64, else eps

    4 eps covers rounding each probability to its dtype (at most eps / 2 of the sum); the
    sqrt(V) term the accumulated error of a softmax computed in float32 (what serving engines
    and torch do for float32, float16 and bfloat16) over V tokens. A float32 ``torch.softmax``
    over 151,936 tokens sums to 1 + 4.3e-6 (accepted: the tolerance there is 1.9e-4); bfloat16
    gets 0.031, float16 0.0041, float64 ``atol``.
    """
    working = eps if eps <= _EPS64 else _EPS32
    return max(atol, 4 * eps + 4 * working * float(np.sqrt(vocab)))


def _first_bad(mask: np.ndarray) -> str:
    index = tuple(int(i) for i in np.argwhere(mask)[0])
    return "" if not index else f" at index {index}"


def as_probability(value, name: str) -> np.ndarray:
    """Return `value` as a float64 array, or raise if any entry is NaN or outside [0, 1]."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real number or array of probabilities in [0, 1]; got {value!r}") from exc
    if arr.size == 0 or (arr.min() >= 0 and arr.max() <= 1):  # fast path: NaN fails both comparisons
        return arr
    bad = np.isnan(arr)
    if bad.any():
        raise ValueError(f"{name} must be a probability in [0, 1]; it contains NaN{_first_bad(bad)}")
    bad = (arr < 0) | (arr > 1)
    if bad.any():
        raise ValueError(f"{name} must be a probability in [0, 1]; got {arr[bad].flat[0].item()!r}{_first_bad(bad)}")
    return arr


def as_delta(value, name: str = "delta") -> np.ndarray:
    """Return a divergence budget as float64, or raise if any entry is NaN or negative (inf is allowed)."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real number >= 0; got {value!r}") from exc
    if arr.size == 0 or arr.min() >= 0:  # fast path: a NaN minimum fails the comparison
        return arr
    bad = np.isnan(arr)
    if bad.any():
        raise ValueError(f"{name} must be a divergence budget >= 0; it contains NaN{_first_bad(bad)}")
    bad = arr < 0
    if bad.any():
        raise ValueError(
            f"{name} must be a divergence budget >= 0 (0 gives the lossless rule); "
            f"got {arr[bad].flat[0].item()!r}{_first_bad(bad)}"
        )
    return arr


def broadcast(**arrays: np.ndarray) -> list[np.ndarray]:
    """np.broadcast_arrays with an error message that names the arguments and their shapes."""
    try:
        return list(np.broadcast_arrays(*arrays.values()))
    except ValueError:
        shapes = ", ".join(f"{k} with shape {np.shape(v)}" for k, v in arrays.items())
        raise ValueError(f"arguments do not broadcast together: {shapes}") from None


#: Defer the checks of torch tensors on the CPU too (tests exercise the deferred path with it).
DEFER_ON_CPU = False


def _deferrable(arr, backend) -> bool:
    """Whether a check of ``arr`` is read back with the call's other checks (``Pending``): torch
    tensors on an accelerator, where reading a value back waits for the device."""
    return backend.name == "torch" and (DEFER_ON_CPU or arr.device.type != "cpu")


class Pending:
    """Checks and repairs of device tensors read back together: their flags are computed on the
    device as the call queues its work, and ``settle`` copies them to the host once, at the call's
    end (after every kernel of the call is queued), so they cost the device its passes and the
    host no round trip of its own. A failing check's flag reruns that check on the host, which
    raises its message; a repair's flag applies the repair (in place). While a call computes, its
    collector is the active one (``active``), so helpers deep in the rule (``residual``) can add to
    it. A caller that makes its own copy to the host (a decoding step) can read ``flags()`` with it
    and pass the values to ``settle``."""

    _ACTIVE = contextvars.ContextVar("cactus_theory_pending", default=None)

    def __init__(self):
        self._flags, self._actions, self._raises = [], [], []

    @classmethod
    def active(cls):
        """The collector of the call computing now, or None."""
        return cls._ACTIVE.get()

    def __enter__(self):
        self._token = self._ACTIVE.set(self)
        return self

    def __exit__(self, *exc):
        self._ACTIVE.reset(self._token)
        return False

    def add(self, flag, check):
        """``flag``: a device bool scalar, True when the input is bad; ``check()``: the host check."""
        self._flags.append(flag.reshape(()))
        self._actions.append(check)
        self._raises.append(True)

    def add_repair(self, flag, repair):
        """``flag``: a device bool scalar, True when ``repair()`` must run (it fixes a result in place)."""
        self._flags.append(flag.reshape(()))
        self._actions.append(repair)
        self._raises.append(False)

    def flags(self):
        """Every flag as one device bool tensor (None when there are none)."""
        if not self._flags:
            return None
        from ._backend import namespace

        return namespace(self._flags[0]).torch.stack(self._flags)

    def settle(self, values=None):
        """Raise the first failing check's ValueError, then run the repairs whose flags are set (one
        copy of every flag to the host, or ``values``: the flags the caller read back already)."""
        if not self._flags:
            return
        values = self.flags().cpu().tolist() if values is None else [bool(v) for v in values]
        actions, raises = self._actions, self._raises
        self._flags, self._actions, self._raises = [], [], []
        for bad, action, fatal in zip(values, actions, raises, strict=True):
            if bad and fatal:
                action()
                raise AssertionError("a device check failed and its host check passed")  # pragma: no cover
        for bad, action, fatal in zip(values, actions, raises, strict=True):
            if bad and not fatal:
                action()


def _row_sums(arr, backend):
    """Row sums for the normalisation check: half precision summed in float32 (one pass, no copy)."""
    if backend.name == "torch" and backend.eps(arr) > _EPS32:
        return arr.sum(dim=-1, dtype=backend.torch.float32)
    summed = arr if backend.eps(arr) <= _EPS32 else backend.promote(arr)
    return backend.sum_last(summed)


def _device_stats(arr, backend):
    """(row sums, row minima) of a device tensor: float32 sums for half precision, the input's dtype
    otherwise. (Fusing the two reductions with ``torch.compile`` was measured slower on an H200:
    docs/results/gpu.md.)"""
    torch = backend.torch
    wide = torch.float32 if arr.dtype in (torch.float16, torch.bfloat16) else arr.dtype
    return arr.sum(dim=-1, dtype=wide), arr.amin(dim=-1)


def check_distribution(arr, name: str, atol: float = NORMALISATION_ATOL, backend=None, pending=None):
    """Check distributions over the last axis: finite, >= 0, each row sums to 1 within the
    tolerance of its dtype and vocabulary size (``normalisation_tolerance``; ``atol`` at least).

    Works on NumPy arrays and (with ``backend``) torch tensors. Costs two read-only passes (row
    sums in the input's dtype, with pairwise / cascade summation, and the minimum); a failing
    input is then scanned for the first bad entry, which the error quotes. ``pending`` (a
    ``Pending``): a torch tensor on an accelerator is checked on the device and read back with the
    call's other checks when the call settles them.
    """
    if backend is None:
        from ._backend import namespace

        backend = namespace(arr)
    arr = backend.asarray(arr)
    shape = backend.shape(arr)
    if len(shape) == 0:
        raise ValueError(f"{name} must have a vocabulary axis (last axis); got a scalar")
    if shape[-1] == 0:
        raise ValueError(f"{name} has an empty vocabulary axis (shape {shape})")
    if not backend.is_floating(arr):
        raise ValueError(f"{name} must be a floating-point array of probabilities; got dtype {arr.dtype}")
    tol = normalisation_tolerance(backend.eps(arr), shape[-1], atol)
    # Two read-only passes: the row sums (NaN and +-inf propagate into them) and the minimum.
    # Only a failing input pays for the detailed diagnosis below.
    if pending is not None and _deferrable(arr, backend):
        sums, low = _device_stats(arr, backend)
        good = backend.torch.isfinite(sums).all() & (low >= 0).all() & ((sums.double() - 1.0).abs() <= tol).all()
        pending.add(~good, lambda: check_distribution(arr, name, atol, backend))
        return arr
    sums = backend.to_numpy(_row_sums(arr, backend)).astype(np.float64)
    if np.all(np.isfinite(sums)) and float(backend.min_all(arr)) >= 0:
        bad = np.abs(sums - 1.0) > tol
        if bad.any():
            raise ValueError(
                f"{name} must sum to 1 over its last axis (tolerance {tol:g}); a row sums to "
                f"{sums[bad].flat[0].item()!r}{_first_bad(bad)}: normalise it (e.g. softmax of logits) first"
            )
        return arr
    _diagnose(arr, name, backend)
    raise ValueError(f"{name} must be finite probabilities; its row sums overflow")  # pragma: no cover


def host_probabilities(arr, name: str, atol: float = NORMALISATION_ATOL) -> np.ndarray:
    """``arr`` (a NumPy array or a torch tensor of any float dtype) checked as distributions over
    the last axis within its own dtype's tolerance (``check_distribution``), as a float64 NumPy
    array; rows of a lower precision than float64 are renormalised in float64, so that exact
    computations start from distributions."""
    from ._backend import namespace

    backend = namespace(arr)
    checked = check_distribution(arr, name, atol, backend=backend)
    host = np.asarray(backend.to_numpy(backend.promote(checked)), dtype=np.float64)
    if backend.eps(checked) > _EPS64:
        host = host / np.sum(host, axis=-1, keepdims=True)
    return host


def _diagnose(arr, name, backend):
    """The first non-finite or negative entry of ``arr``, as a ValueError."""
    bad = ~backend.isfinite(arr)
    if backend.any(bad):
        bad = backend.to_numpy(bad)
        value = backend.to_numpy(arr)[bad].flat[0].item()
        raise ValueError(f"{name} must be finite probabilities; it contains {value!r}{_first_bad(bad)}")
    bad = arr < 0
    if backend.any(bad):
        bad = backend.to_numpy(bad)
        value = backend.to_numpy(arr)[bad].flat[0].item()
        raise ValueError(f"{name} must be non-negative; got {value!r}{_first_bad(bad)}")


def check_token(token, vocab_size: int, name: str, backend, pending=None):
    """Check integer token ids in [0, vocab_size). With ``pending`` (see ``check_distribution``) a
    device tensor is checked on the device, and the ids returned are clipped to the vocabulary, so
    the call's gathers stay in bounds until the check is read back and raises."""
    token = backend.asarray(token)
    if not backend.is_integer(token):
        raise ValueError(f"{name} must be integer token ids; got dtype {token.dtype}")
    if pending is not None and _deferrable(token, backend):
        pending.add(((token < 0) | (token >= vocab_size)).any(), lambda: check_token(token, vocab_size, name, backend))
        return token.clamp(0, vocab_size - 1)
    host = backend.to_numpy(token)
    bad = (host < 0) | (host >= vocab_size)
    if bad.any():
        raise ValueError(
            f"{name} must lie in [0, {vocab_size}) (the vocabulary size); "
            f"got {host[bad].flat[0].item()!r}{_first_bad(bad)}"
        )
    return token


def seeded_rng(seed, name="seed"):
    """``np.random.default_rng(seed)`` for a seed that is an integer >= 0, a sequence of them (an
    entropy pool), a ``SeedSequence`` or a ``Generator`` (used as it is); anything else is a
    ValueError naming ``name``."""
    if isinstance(seed, (np.random.Generator, np.random.SeedSequence)):
        return np.random.default_rng(seed)

    def whole(x):
        return not isinstance(x, (bool, np.bool_)) and isinstance(x, (int, np.integer)) and x >= 0

    if isinstance(seed, (list, tuple, np.ndarray)) and len(seed) and all(whole(x) for x in np.ravel(seed)):
        return np.random.default_rng([int(x) for x in np.ravel(seed)])
    if not whole(seed):
        raise ValueError(f"{name} must be an integer >= 0 (or a numpy Generator); got {seed!r}")
    return np.random.default_rng(int(seed))


def is_integer(value) -> bool:
    """An integer, Python's or NumPy's, and not a bool."""
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, np.integer))


def check_int(value, name: str, low=None, *, high=None, what: str = "", error=ValueError) -> int:
    """``value`` as an int when it is an integer (``is_integer``) in [``low``, ``high``] (either bound may
    be None); otherwise one ``error`` line naming ``name``, the bounds and what the number counts
    (``what``): "m must be an integer >= 1 (drafted tokens per verification); got 0"."""
    if is_integer(value) and (low is None or value >= low) and (high is None or value <= high):
        return int(value)
    if low is not None and high is not None:
        bound = f" between {low} and {high}"
    elif low is not None:
        bound = f" >= {low}"
    elif high is not None:
        bound = f" <= {high}"
    else:
        bound = ""
    raise error(f"{name} must be an integer{bound}{f' ({what})' if what else ''}; got {value!r}")


#: The largest counts a run may ask for, checked before any model loads (past them no machine this package
#: targets finishes, and a cache of that many slots cannot be allocated): drafted tokens a step, new tokens
#: an answer, sequences decoded at once, samples of a problem.
RUN_LIMITS = {"m": 256, "max_new_tokens": 131_072, "batch": 1024, "samples": 10_000}


def check_count(value, name: str, *, what: str = "", error=ValueError) -> int:
    """``value`` as an int in [1, ``RUN_LIMITS[name]``] (``check_int``'s one-line error otherwise)."""
    return check_int(value, name, 1, high=RUN_LIMITS[name], what=what, error=error)


class SettingError(ValueError):
    """A refusal of one setting, said in the library's words (``str``: "setting=...: why") and known by the
    ``setting`` it concerns, so that a command line can say the same ``why`` in its own words: the flag that gave
    the setting (``_cli._main``)."""

    def __init__(self, setting: str, why: str, *, given: str = ""):
        self.setting, self.why = setting, why
        super().__init__(f"{given or setting}: {why}")
