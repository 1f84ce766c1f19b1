"""rollart: plan, simulate and run disaggregated multi-task agentic RL training."""

__version__ = "0.1.0"
