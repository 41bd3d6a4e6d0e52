"""Modelled GPU costs at any batch size: a roofline from a model's shape and a device's published
specification, fitted to the measured vLLM profiles the package ships. Every number it gives is
modelled, not measured, and says so in its cost model's ``source``.

One forward of B sequences with L new tokens each at a context of c tokens moves the weights once
and each sequence's KV cache, and does 2 N FLOPs per token (N parameters in matrix products)
plus attention's 4 c d_attn per token and layer:

    bytes = N_bytes + B c kv_bytes_per_token,   flops = 2 N_matmul B L + 4 B L c layers heads head_dim
    t = max(bytes / bandwidth, flops / peak) / efficiency + overhead + verify_overhead [L > 1]

``efficiency``, ``overhead`` (per forward: launches, scheduling, sampling) and ``verify_overhead``
(the extra of a multi-token verification pass over one decoded token) are fitted to the shipped
profiles' measured points (``fit_to_profiles``: each point's error is kept). A100, H100, H200,
B200, GB200 and MI300X specifications are built in (dense, no sparsity); model shapes come from a
Hugging Face ``config.json`` or the presets of the paper's Qwen3 pairs.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BATCH_CONTEXT",
    "DEVICES",
    "MAX_CONTEXT",
    "MODEL_PRESETS",
    "DeviceSpec",
    "ModelShape",
    "Roofline",
    "fit",
    "preset_of",
]


@dataclass(frozen=True)
class DeviceSpec:
    """A device's published peak figures: HBM bandwidth (bytes/s) and dense matrix throughput
    (FLOP/s) in bf16 and fp8 (None where the device has none)."""

    name: str
    bandwidth: float
    bf16: float
    fp8: float | None
    source: str

    def peak(self, dtype: str) -> float:
        if dtype in ("float8", "fp8"):
            if self.fp8 is None:
                raise ValueError(f"{self.name} has no fp8 matrix units; use dtype='bfloat16'")
            return self.fp8
        return self.bf16


#: Published per-GPU specifications (dense: no structured sparsity), from the vendors' data sheets.
DEVICES = {
    "a100": DeviceSpec("NVIDIA A100 80GB SXM", 2.039e12, 312e12, None, "NVIDIA A100 data sheet"),
    "h100": DeviceSpec("NVIDIA H100 SXM", 3.35e12, 989e12, 1979e12, "NVIDIA H100 data sheet"),
    "h200": DeviceSpec("NVIDIA H200 SXM", 4.8e12, 989e12, 1979e12, "NVIDIA H200 data sheet"),
    "b200": DeviceSpec("NVIDIA B200", 8.0e12, 2250e12, 4500e12, "NVIDIA DGX B200 / HGX B200 data sheet"),
    "gb200": DeviceSpec(
        "NVIDIA GB200 (one Blackwell GPU)", 8.0e12, 2500e12, 5000e12, "NVIDIA GB200 NVL72 data sheet, per GPU"
    ),
    "mi300x": DeviceSpec("AMD Instinct MI300X", 5.3e12, 1307e12, 2615e12, "AMD MI300X data sheet"),
}

#: ``config.json`` fields of the paper's Qwen3 models (Hugging Face Qwen/Qwen3-*), as presets.
MODEL_PRESETS = {
    "qwen3-0.6b": {
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "qwen3-1.7b": {
        "hidden_size": 2048,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 6144,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "qwen3-8b": {
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 12288,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    },
    "qwen3-14b": {
        "hidden_size": 5120,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 17408,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    },
    "qwen3-32b": {
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 25600,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    },
}

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8": 1, "fp8": 1}
#: Bounds of what the roofline takes: a config.json's size (a config is a few kB), each shape field
#: (the largest models have widths near 10^5 and vocabularies near 10^6), and the context in tokens.
MAX_CONFIG_BYTES = 1 << 20
MAX_SHAPE_FIELD = 10**7
MAX_CONTEXT = 10**7


@dataclass(frozen=True)
class ModelShape:
    """What a forward costs depends on: the layers and widths of a decoder-only transformer with
    grouped-query attention and a gated MLP (Qwen, Llama), and the bytes per weight."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    dtype: str = "bfloat16"

    @classmethod
    def from_config(cls, config, dtype="bfloat16", name=None) -> ModelShape:
        """From a Hugging Face ``config.json`` (a dict, a path to the file or to its directory) or
        a preset name (``MODEL_PRESETS``)."""
        if isinstance(config, str) and config.lower() in MODEL_PRESETS:
            name, config = name or config.lower(), MODEL_PRESETS[config.lower()]
        elif isinstance(config, (str, os.PathLike)):
            path = os.path.join(config, "config.json") if os.path.isdir(config) else os.fspath(config)
            try:
                with open(path, "rb") as fh:
                    import stat

                    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                        raise ValueError("not a regular file")
                    raw = fh.read(MAX_CONFIG_BYTES + 1)
                if len(raw) > MAX_CONFIG_BYTES:
                    raise ValueError(f"over {MAX_CONFIG_BYTES:,} bytes: a config.json is a few kB")
                config = json.loads(raw.decode("utf-8"))
            except (OSError, ValueError) as exc:
                raise ValueError(
                    f"model config {path!r} could not be read as a config.json ({exc}); give a path or one of "
                    f"{', '.join(MODEL_PRESETS)}"
                ) from None
            name = name or os.path.basename(os.path.dirname(os.path.abspath(path)))
        if not isinstance(config, dict):
            raise ValueError(f"model config must be a config.json's fields, a path or a preset name; got {config!r}")
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPE_BYTES)}; got {dtype!r}")

        def whole(key, default=None):
            value = config.get(key, default) if default is not None else config[key]
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not np.isfinite(value)
                or (value != int(value) or not 1 <= value <= MAX_SHAPE_FIELD)
            ):
                raise ValueError(f"{key} = {value!r} (a whole number, 1 to {MAX_SHAPE_FIELD:,})")
            return int(value)

        try:
            hidden, heads = whole("hidden_size"), whole("num_attention_heads")
            shape = cls(
                name=name or "model",
                layers=whole("num_hidden_layers"),
                hidden=hidden,
                heads=heads,
                kv_heads=whole("num_key_value_heads", config.get("num_key_value_heads") or heads),
                head_dim=whole("head_dim", config.get("head_dim") or max(hidden // heads, 1)),
                intermediate=whole("intermediate_size"),
                vocab=whole("vocab_size"),
                tied=bool(config.get("tie_word_embeddings", False)),
                dtype=dtype,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"model config lacks or garbles {exc}: it needs hidden_size, num_hidden_layers, num_attention_heads, "
                "intermediate_size and vocab_size (num_key_value_heads, head_dim, tie_word_embeddings optional)"
            ) from None
        for field in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            if getattr(shape, field) < 1:
                raise ValueError(f"model config: {field} must be >= 1; got {getattr(shape, field)}")
        return shape

    @property
    def matmul_parameters(self) -> int:
        """Parameters in matrix products per token: attention, MLP and the output head."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp) + self.vocab * self.hidden

    @property
    def parameters(self) -> int:
        """Every weight (the input embedding counted once more when it is not tied to the head)."""
        return self.matmul_parameters + (0 if self.tied else self.vocab * self.hidden)

    @property
    def weight_bytes(self) -> float:
        return self.parameters * _DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> float:
        return self.layers * 2 * self.kv_heads * self.head_dim * _DTYPE_BYTES[self.dtype]

    def forward(self, batch: int, tokens: int, context: int) -> tuple:
        """(bytes moved, FLOPs) of one forward of ``batch`` sequences with ``tokens`` new tokens each
        at ``context`` tokens of cache."""
        moved = self.weight_bytes + batch * (context + tokens) * self.kv_bytes_per_token
        flops = 2.0 * self.matmul_parameters * batch * tokens
        flops += 4.0 * batch * tokens * (context + tokens) * self.layers * self.heads * self.head_dim
        return moved, flops


@dataclass(frozen=True)
class Roofline:
    """t = max(bytes / bandwidth, flops / peak) / efficiency + overhead + verify_overhead [tokens > 1]."""

    device: DeviceSpec
    efficiency: float = 1.0
    overhead: float = 0.0
    verify_overhead: float = 0.0

    def time(self, model: ModelShape, batch: int, tokens: int, context: int) -> float:
        moved, flops = model.forward(batch, tokens, context)
        peak = self.device.peak(model.dtype)
        core = max(moved / self.device.bandwidth, flops / peak) / self.efficiency
        return core + self.overhead + (self.verify_overhead if tokens > 1 else 0.0)


def preset_of(hf_name) -> str:
    """The preset name of a Hugging Face model id (``Qwen/Qwen3-32B`` -> ``qwen3-32b``)."""
    key = str(hf_name or "").split("/")[-1].lower()
    if key not in MODEL_PRESETS:
        raise ValueError(f"no shape preset for model {hf_name!r}; give its config.json")
    return key


#: The context (tokens of cache) the shipped profiles are taken at: they time synthetic inputs with
#: no context dependence, so a short one.
PROFILE_CONTEXT = 128
#: The context (tokens of cache per sequence) batch scaling assumes: a typical serving request.
BATCH_CONTEXT = 1024


@functools.lru_cache(maxsize=8)
def fit(points, device="gb200"):
    """The efficiency (0.05-1), overhead and verify overhead that fit measured points, by least squares
    on the logarithms of the times: ``points`` a tuple of (ModelShape, tokens, seconds, label), one
    sequence at ``PROFILE_CONTEXT`` tokens of context on ``device``. Returns (efficiency, overhead,
    verify overhead, rows: each point with its modelled value and relative error)."""
    spec = DEVICES[device]
    cores = []
    for model, tokens, _, _ in points:
        moved, flops = model.forward(1, tokens, PROFILE_CONTEXT)
        cores.append(max(moved / spec.bandwidth, flops / spec.peak(model.dtype)))
    cores = np.array(cores)
    measured = np.array([p[2] for p in points])
    multi = np.array([p[1] > 1 for p in points])
    best = None
    for efficiency in np.linspace(0.05, 1.0, 96):
        base = cores / efficiency
        o1 = max(float(np.median((measured - base)[~multi])), 0.0)
        o2 = max(float(np.median((measured - base - o1)[multi])), 0.0)
        for _ in range(3):  # the overheads by a grid refined around the medians
            grid1 = np.linspace(0.0, max(2 * o1, 1e-4), 41)
            o1 = min(grid1, key=lambda o: np.sum(np.log((base + o + o2 * multi) / measured) ** 2))
            grid2 = np.linspace(0.0, max(2 * o2, 1e-4), 41)
            o2 = min(grid2, key=lambda o: np.sum(np.log((base + o1 + o * multi) / measured) ** 2))
        loss = float(np.sum(np.log((base + o1 + o2 * multi) / measured) ** 2))
        if best is None or loss < best[0]:
            best = (loss, float(efficiency), float(o1), float(o2))
    _, efficiency, overhead, verify_overhead = best
    fitted = Roofline(spec, efficiency, overhead, verify_overhead)
    rows = tuple(
        {
            "point": label,
            "measured": float(seconds),
            "modelled": fitted.time(model, 1, tokens, PROFILE_CONTEXT),
            "error": fitted.time(model, 1, tokens, PROFILE_CONTEXT) / float(seconds) - 1.0,
        }
        for model, tokens, seconds, label in points
    )
    return efficiency, overhead, verify_overhead, rows
