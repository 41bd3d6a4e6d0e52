"""Every long run is a study (``Study``), run by one runner (``run_study``: the record log, resume, progress, the
interruption line, a Dask cluster); every result shares one base (``Result``: ``records``, ``table``,
``markdown``, ``figure``, ``write``). ``cactus_theory.testing.check_study`` checks a study keeps the contract."""

from __future__ import annotations

from ._util._results import Result, RowsResult, figure_png
from ._util._study import Study, run_study

__all__ = [
    "Result",
    "RowsResult",
    "Study",
    "figure_png",
    "run_study",
]
