"""Fit and scale planner: memory model (memory.py), legal Parallel Folding layouts (layouts.py),
ranked fit plans (plan.py); their assumed numbers in planner.yaml (config.py). See docs/planner.md."""

from moetune.analyzer.planner.config import PlannerConfig, load_planner_config
from moetune.analyzer.planner.layouts import Topology, enumerate_layouts
from moetune.analyzer.planner.memory import (
    FitOptions,
    Layout,
    ModelSpec,
    Workload,
    estimate_memory,
    model_spec,
)
from moetune.analyzer.planner.plan import (
    Outcome,
    Plan,
    plan_fit,
    read_contract,
    request_from_contract,
)

__all__ = [
    "FitOptions", "Layout", "ModelSpec", "Outcome", "Plan", "PlannerConfig", "Topology", "Workload",
    "enumerate_layouts", "estimate_memory", "load_planner_config", "model_spec", "plan_fit",
    "read_contract", "request_from_contract",
]
