"""What a benchmark written elsewhere needs: the base class (``Benchmark``: subclass it with a ``name``, its
``prompt``, and for a graded one its ``reference`` and ``grade``; defining the class registers it), the records it
returns (``Grade``, ``Problem``), and the registry's readers (``benchmark_names``, ``get_benchmark``), and for one
that runs model-written code, the isolated runner the built-in ones use (``run_sandboxed``, ``SandboxResult``; run
only when the user opted in: ``require_code_execution``). Give the module to the command line with ``--plugin
FILE``, or name it in the entry point group ``cactus_theory.benchmarks`` of your distribution."""

from ._data._benchmarks import (
    ENTRY_POINT_GROUP,
    Benchmark,
    Grade,
    Problem,
    benchmark_names,
    get_benchmark,
    require_code_execution,
)
from ._data._graders import grade, load_problems
from ._util._sandbox import SandboxResult, run_sandboxed

__all__ = [
    "ENTRY_POINT_GROUP",
    "Benchmark",
    "Grade",
    "Problem",
    "SandboxResult",
    "benchmark_names",
    "get_benchmark",
    "grade",
    "load_problems",
    "require_code_execution",
    "run_sandboxed",
]
