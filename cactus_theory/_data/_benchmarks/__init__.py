"""The benchmarks: one module per benchmark (its file, its prompt, what grades an answer) behind the interface
and registry of ``_registry``. Importing this package imports every module in it (except the private ones,
whose names start with an underscore), so every benchmark class defines, and so registers, itself: a new
benchmark is one new module here, or one module of the user's (``--plugin``, or the entry point group
``cactus_theory.benchmarks``)."""

import importlib
import pkgutil

from ._registry import (
    CODE_EXECUTION_ENV,
    DATA_ENV,
    ENTRY_POINT_GROUP,
    PROGRAM_SECONDS,
    Benchmark,
    Grade,
    Problem,
    benchmark_file,
    benchmark_names,
    code_execution_allowed,
    data_directory,
    get_benchmark,
    load_benchmark_plugins,
    require_code_execution,
)

_MODULES = tuple(
    importlib.import_module(f"{__name__}.{info.name}")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name)
    if not info.name.startswith("_")
)

__all__ = [
    "CODE_EXECUTION_ENV",
    "DATA_ENV",
    "ENTRY_POINT_GROUP",
    "PROGRAM_SECONDS",
    "Benchmark",
    "Grade",
    "Problem",
    "benchmark_file",
    "benchmark_names",
    "code_execution_allowed",
    "data_directory",
    "get_benchmark",
    "load_benchmark_plugins",
    "require_code_execution",
]
