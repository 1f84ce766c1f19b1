"""Mixture-of-experts weight traffic: how many experts a batch of tokens touches.

Each token is routed to ``active`` of ``experts`` experts. With the router's choices taken as
independent and uniform, an expert escapes all ``B`` tokens of a step with probability
``(1 − k/E)^B``, so the step reads the weights of

    E_touched(B) = E · (1 − (1 − k/E)^B)

experts on average: ``k`` for one token, rising monotonically towards ``E`` as the batch grows.
Decode at a realistic batch is therefore much closer to reading the whole model than to reading
only one token's active experts. Both the roofline (``sim.costs.gpu``) and the calibrated
kernel-profile cost (``calibration.cost``) use these helpers, so the two agree.
A dense model is the case ``E = k = 1``.
"""

from __future__ import annotations

import math

from rollart.plan.schema import ModelSpec


def experts_touched(tokens: float, experts: int, active: int) -> float:
    """Expected distinct experts read by a step over ``tokens`` tokens with top-``active`` routing
    among ``experts``: ``E·(1 − (1 − k/E)^B)``, within [min(k, E), E]; 0 for no tokens."""
    if tokens <= 0:
        return 0.0
    experts = max(1, experts)
    active = min(max(1, active), experts)
    if active == experts:
        return float(experts)
    # 1 − (1 − k/E)^B without cancellation when k/E is small
    touched = -experts * math.expm1(tokens * math.log1p(-active / experts))
    return min(float(experts), max(float(active), touched))


def model_experts_touched(model: ModelSpec, tokens: float) -> float:
    """:func:`experts_touched` for ``model`` (1 for a dense model)."""
    if not model.moe_experts:
        return 1.0 if tokens > 0 else 0.0
    return experts_touched(tokens, model.moe_experts, model.moe_active_experts)


def expert_params(model: ModelSpec) -> int:
    """Parameters of all the experts' MLPs (0 for a dense model: its MLP is not an expert)."""
    return model.layers * 3 * model.hidden * model.intermediate * model.moe_experts


def weight_bytes_read(model: ModelSpec, tokens: float) -> float:
    """BF16 weight bytes one forward step over ``tokens`` tokens reads: every non-expert weight
    plus the experts the batch touches. Equals ``model.weight_bytes`` for a dense model."""
    if not model.moe_experts:
        return float(model.weight_bytes)
    per_expert = 2.0 * expert_params(model) / model.moe_experts
    dense = model.weight_bytes - 2.0 * expert_params(model)
    return dense + per_expert * model_experts_touched(model, max(1.0, tokens))
