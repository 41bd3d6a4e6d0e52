"""What a benchmark written elsewhere needs: the base class (``Benchmark``: subclass it with a ``name``, its
``prompt``, and for a graded one its ``reference`` and ``grade``; defining the class registers it), the
records it returns (``Grade``, ``Problem``), and the registry's readers (``benchmark_names``,
``get_benchmark``). Give the module to the command line with ``--plugin FILE``, or name it in the entry point
group ``cactus_theory.benchmarks`` of your distribution."""

from ._data._benchmarks import (
    ENTRY_POINT_GROUP,
    Benchmark,
    Grade,
    Problem,
    benchmark_names,
    get_benchmark,
)
from ._data._graders import grade, load_problems

__all__ = [
    "ENTRY_POINT_GROUP",
    "Benchmark",
    "Grade",
    "Problem",
    "benchmark_names",
    "get_benchmark",
    "grade",
    "load_problems",
]
