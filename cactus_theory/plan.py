"""What a rule buys: the cost of a step (``CostModel``: calibrated on this machine, a server, a measured GPU
profile or a roofline), each rule's predicted speedup with its interval, per request and at concurrency
(``predict_speedup``, ``batch_plan``), the planner's referee on a real server, and the deployment decision: every
setting's speed against its exact accuracy cost, the front and the fastest setting within a budget
(``deployment_frontier``)."""

from __future__ import annotations

from ._analysis._batch import BatchResult, batch_requests, simulate_batch, steps_law, verify_budget
from ._analysis._calibrations import default_cost_path
from ._analysis._cost import DEFAULT_COST_PROFILE, CostModel, cost_profiles, fit_to_profiles, load_cost, roofline_cost
from ._analysis._frontier import Frontier, decide, deployment_frontier, frontier_rules
from ._analysis._plan import Plan, batch_plan, break_even, predict_speedup
from ._analysis._plotting import plot_plan
from ._analysis._roofline import DEVICES, MODEL_PRESETS, DeviceSpec, ModelShape, Roofline
from ._models._calibrate import calibrate_cost
from ._servers._calibrate import calibrate_server
from ._servers._referee import drive_server

__all__ = [
    "DEFAULT_COST_PROFILE",
    "DEVICES",
    "MODEL_PRESETS",
    "BatchResult",
    "CostModel",
    "DeviceSpec",
    "Frontier",
    "ModelShape",
    "Plan",
    "Roofline",
    "batch_plan",
    "batch_requests",
    "break_even",
    "calibrate_cost",
    "calibrate_server",
    "cost_profiles",
    "decide",
    "default_cost_path",
    "deployment_frontier",
    "drive_server",
    "fit_to_profiles",
    "frontier_rules",
    "load_cost",
    "plot_plan",
    "predict_speedup",
    "roofline_cost",
    "simulate_batch",
    "steps_law",
    "verify_budget",
]
