"""How an analysis runs, beside the trace and the rules: one record (``AnalysisOptions``) that the command
line builds from its arguments in one place (``_cli._common.analysis_options``) and ``analyze_trace``
takes whole (``options=``), instead of a dozen keywords passed on one by one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["AnalysisOptions"]


@dataclass(frozen=True)
class AnalysisOptions:
    """``analyze_trace``'s settings (each as its keyword of the same name documents it)."""

    ms: tuple = (4, 8, 20)
    settings: object = None
    n_boot: int = 1000
    seed: int = 0
    processes: int = 1
    bonus_policy: str = "verifier"
    tasks: object = None
    draft_mode: str = "sampled"
    block_paths: int = 1024
    draft_policies: object = None
    cost: object = None
    position_acceptance: bool = False
    gate: object = None

    def keywords(self) -> dict:
        """The fields as keywords (shallow: the objects themselves, not copies)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
