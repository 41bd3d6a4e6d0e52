"""The benchmarks: one module per benchmark (its file, its prompt, what grades an answer) behind the interface
and registry of ``_registry``. Importing this package imports every module in it (except the private ones,
whose names start with an underscore), so every benchmark class defines, and so registers, itself: a new
benchmark is one new module here, or one module of the user's (``--plugin``, or the entry point group
``cactus_theory.benchmarks``)."""

import importlib
import pkgutil

from . import _registry
from ._registry import *  # noqa: F403 (the registry's names, re-exported)

_MODULES = tuple(
    importlib.import_module(f"{__name__}.{info.name}")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name)  # noqa: F405
    if not info.name.startswith("_")
)

#: The registry's names but its helpers for benchmark modules.
__all__ = [name for name in _registry.__all__ if name not in ("first_turn", "short", "text_field")]
