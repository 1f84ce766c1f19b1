"""The plan a user writes (schema), its presets, and loading from YAML."""

from rollart.plan.loader import PlanError, apply_overrides, load_plan, plan_from_dict, read_yaml
from rollart.plan.schema import MODES, Plan

__all__ = ["MODES", "Plan", "PlanError", "apply_overrides", "load_plan", "plan_from_dict", "read_yaml"]
