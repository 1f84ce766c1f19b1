"""A tiny task a random-initialised model can learn on a CPU in minutes.

``Digits``: the prompt asks for digits; the reward is the share of digit characters in the
answer (0 to 1). A random policy writes few digits; GRPO's group-relative advantage pushes
the digit tokens up within tens of steps, so "it learns" is measurable quickly."""

from __future__ import annotations

from rollart.runtime.envs.base import StepResult

PROMPT = "Reply with digits only, for example 4 7 1 9."


def digit_share(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


class DigitsEnv:
    name = "Digits"

    def reset(self, seed: int) -> str:
        return PROMPT

    def step(self, action: str) -> StepResult:
        share = digit_share(action)
        return StepResult(observation="", reward=share, done=True, info={"digit_share": share})

    def close(self) -> None:
        pass
