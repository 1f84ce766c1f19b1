"""A tiny task a random-initialised model can learn on a CPU in minutes.

``Digits``: the prompt asks for digits; the reward is the share of digit characters in the
answer (0 to 1). A random policy writes few digits; GRPO's group-relative advantage pushes
the digit tokens up within tens of steps, so "it learns" is measurable quickly.

``turns`` > 1 makes it multi-turn: each answer is scored and the env asks again, until the
last turn (a fixed episode length, which is what ``rollart validate`` needs to compare a real
multi-turn run with the plan's ``turns``)."""

from __future__ import annotations

from rollart.runtime.envs.base import StepResult

PROMPT = "Reply with digits only, for example 4 7 1 9."
AGAIN = "Again: digits only."


def digit_share(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


class DigitsEnv:
    name = "Digits"

    def __init__(self, turns: int = 1):
        if int(turns) < 1:
            raise ValueError(f"Digits: turns must be at least 1, got {turns}")
        self.turns = int(turns)
        self._turn = 0

    def reset(self, seed: int) -> str:
        self._turn = 0
        return PROMPT

    def step(self, action: str) -> StepResult:
        self._turn += 1
        share = digit_share(action)
        done = self._turn >= self.turns
        # each turn's reward is its share of the episode, so an episode's total stays in [0, 1]
        return StepResult(observation="" if done else AGAIN, reward=share / self.turns, done=done,
                          info={"digit_share": share, "turn": self._turn})

    def close(self) -> None:
        pass
