"""FrozenLake (gymnasium ``FrozenLake-v1``) behind the text interface.

The observation is the grid as text with the agent drawn as ``P``, its row/column, and the
instruction to answer with one of LEFT / DOWN / RIGHT / UP. The action parser is lenient: the
first of those words found in the answer (case-insensitive, whole word) is the move. An answer
with none of them is a no-op: the agent stays, the step counts against ``max_steps``, the
reward is 0 and ``info`` carries ``invalid_action=True`` and ``penalty`` (a small positive
number the reward function may subtract; the env itself only ever pays 1 for the goal).

The episode ends on the goal (reward 1), in a hole (reward 0) or after ``max_steps`` moves
(``info["truncated"]``). The default is the fixed 4x4 map, not slippery; with
``random_map=True`` each ``reset(seed)`` draws a solvable map of ``size`` from the seed.
"""

from __future__ import annotations

import re
from collections import deque

import gymnasium as gym
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from rollart.runtime.envs.base import StepResult

ACTIONS = ("LEFT", "DOWN", "RIGHT", "UP")  # gymnasium's action ids 0..3
_ACTION_RE = re.compile(r"\b(LEFT|DOWN|RIGHT|UP)\b", re.IGNORECASE)
_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}


def parse_action(text: str) -> int | None:
    """The first LEFT/DOWN/RIGHT/UP word in ``text`` as gymnasium's action id, else None."""
    m = _ACTION_RE.search(text or "")
    return ACTIONS.index(m.group(1).upper()) if m else None


class FrozenLakeTextEnv:
    """A text FrozenLake. ``name`` is the task name it was made for."""

    def __init__(self, name: str = "FrozenLake", *, map_name: str = "4x4", is_slippery: bool = False,
                 random_map: bool = False, size: int = 4, max_steps: int = 20, invalid_penalty: float = 0.05):
        self.name = name
        self.map_name = map_name
        self.is_slippery = is_slippery
        self.random_map = random_map
        self.size = size
        self.max_steps = max_steps
        self.invalid_penalty = invalid_penalty
        self._env: gym.Env | None = None
        self._desc: list[str] = []
        self._state = 0
        self._steps = 0
        self._done = True

    # ----------------------------------------------------------------- helpers

    @property
    def desc(self) -> list[str]:
        """The current map, one string per row (S start, F frozen, H hole, G goal)."""
        return list(self._desc)

    @property
    def position(self) -> tuple[int, int]:
        return divmod(self._state, len(self._desc[0]))

    def render_text(self) -> str:
        row, col = self.position
        lines = []
        for r, line in enumerate(self._desc):
            cells = ["P" if (r, c) == (row, col) else ch for c, ch in enumerate(line)]
            lines.append(" ".join(cells))
        return "\n".join(lines)

    def _prompt(self, feedback: str = "") -> str:
        row, col = self.position
        n_rows, n_cols = len(self._desc), len(self._desc[0])
        head = (f"FrozenLake {n_rows}x{n_cols}. You are P on a frozen lake: S start, F frozen (safe), "
                "H hole (falling in ends the game), G goal. Row 0 is the top, column 0 the left.\n")
        return (f"{feedback}{head}{self.render_text()}\n"
                f"You are at row {row}, column {col}. Moves left: {self.max_steps - self._steps}.\n"
                "Answer with exactly one of: LEFT, DOWN, RIGHT, UP.")

    def shortest_path(self) -> list[str]:
        """Moves of a shortest hole-free path from the current cell to the goal (BFS on the
        non-slippery dynamics); [] when already there or unreachable. A scripted optimal policy."""
        n_rows, n_cols = len(self._desc), len(self._desc[0])
        start = self.position
        prev: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
        queue = deque([start])
        goal = None
        while queue:
            cell = queue.popleft()
            if self._desc[cell[0]][cell[1]] == "G":
                goal = cell
                break
            for a, (dr, dc) in _MOVES.items():
                nr, nc = min(max(cell[0] + dr, 0), n_rows - 1), min(max(cell[1] + dc, 0), n_cols - 1)
                if (nr, nc) not in prev and self._desc[nr][nc] != "H":
                    prev[(nr, nc)] = (cell, a)
                    queue.append((nr, nc))
        if goal is None:
            return []
        path: list[str] = []
        cur = goal
        while prev[cur] is not None:
            cur, a = prev[cur]  # type: ignore[misc]
            path.append(ACTIONS[a])
        return path[::-1]

    # ----------------------------------------------------------------- TextEnv

    def reset(self, seed: int) -> str:
        if self._env is not None:
            self._env.close()
        if self.random_map:
            desc = generate_random_map(size=self.size, p=0.8, seed=seed)
            self._env = gym.make("FrozenLake-v1", desc=desc, is_slippery=self.is_slippery)
        else:
            self._env = gym.make("FrozenLake-v1", map_name=self.map_name, is_slippery=self.is_slippery)
        state, _ = self._env.reset(seed=seed)
        self._desc = [b"".join(row).decode() for row in self._env.unwrapped.desc]
        self._state = int(state)
        self._steps = 0
        self._done = False
        return self._prompt()

    def step(self, action: str) -> StepResult:
        if self._env is None or self._done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset() first")
        self._steps += 1
        move = parse_action(action)
        info: dict = {"invalid_action": move is None, "penalty": 0.0, "reached_goal": False,
                      "fell_in_hole": False, "truncated": False}
        if move is None:
            info["penalty"] = self.invalid_penalty
            reward, terminated = 0.0, False
            feedback = "Invalid action: answer with one of LEFT, DOWN, RIGHT, UP. You did not move.\n"
        else:
            state, r, terminated, _trunc, _ = self._env.step(move)
            self._state = int(state)
            reward = float(r)
            row, col = self.position
            cell = self._desc[row][col]
            info["reached_goal"] = cell == "G"
            info["fell_in_hole"] = cell == "H"
            info["action"] = ACTIONS[move]
            feedback = f"You moved {ACTIONS[move]}.\n"
        truncated = not terminated and self._steps >= self.max_steps
        info["truncated"] = truncated
        self._done = bool(terminated or truncated)
        if info["reached_goal"]:
            obs = "You reached the goal G. The episode is over."
        elif info["fell_in_hole"]:
            obs = "You fell into a hole. The episode is over."
        elif truncated:
            obs = f"Out of moves after {self._steps} steps. The episode is over."
        else:
            obs = self._prompt(feedback)
        info["position"] = list(self.position)
        info["steps"] = self._steps
        return StepResult(observation=obs, reward=reward, done=self._done, info=info)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
