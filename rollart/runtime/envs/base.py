"""The environment interface: text in, text out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class StepResult:
    observation: str
    reward: float          # the env's own score for this step (0 when the env gives none)
    done: bool
    info: dict


class TextEnv(Protocol):
    """``reset`` returns the first observation (the task prompt); ``step`` applies the model's
    action text. Either may raise: the EnvManager counts it as an env failure."""

    name: str

    def reset(self, seed: int) -> str: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...
