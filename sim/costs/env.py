"""Environment behaviour drawn from a task's distributions, one seeded stream per trajectory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rollart.core.effects import EnvOutcome
from rollart.plan.schema import TaskSpec


_BLOCK = 32  # draws per block once a trajectory's stream is single-kind (see _Block)
# A prompt that leaves no room in the task's window is not in a training set: RL harnesses filter such
# prompts out of the dataset (verl's data.filter_overlong_prompts), and an engine refuses them (vLLM:
# longer than max_model_len). So a draw that long is drawn again; the schema refuses a distribution whose
# draws mostly are (schema.overlong_prompt_share), so the cut after this many draws is never reached in
# practice (a chance below 2⁻³²) and only keeps the loop finite.
PROMPT_DRAWS = 32


def _prompt_tokens(task: TaskSpec, rng: np.random.Generator) -> int:
    """A first prompt's tokens: a draw of ``task.prompt_tokens`` shorter than the task's window."""
    window = task.max_context_tokens
    for _ in range(PROMPT_DRAWS):
        tokens = task.draw_prompt_tokens(rng)
        if tokens < window:
            return tokens
    return max(1, window - 1)


class _Block:
    """A trajectory's stream drawn ``_BLOCK`` values at a time, for a stream that from here on is
    used by one kind of draw only (``standard_normal`` or ``random``). numpy fills an array with
    the same values, in the same order, as that many scalar calls, so the results are identical;
    one call per block instead of one per draw is what saves the time. A draw of the other kind
    is an AttributeError, never a silently different stream."""

    __slots__ = ("_rng", "_vals", "_fill")

    def __init__(self, rng: np.random.Generator, kind: str):
        self._rng = rng
        self._vals: list[float] = []
        self._fill = getattr(rng, kind)

    def _next(self) -> float:
        if not self._vals:
            self._vals = self._fill(_BLOCK).tolist()
            self._vals.reverse()
        return self._vals.pop()


class _NormalBlock(_Block):
    __slots__ = ()

    def standard_normal(self) -> float:
        return self._next()


class _UniformBlock(_Block):
    __slots__ = ()

    def random(self) -> float:
        return self._next()


# which call of the stream a distribution makes per draw (None: no draw); others are mixed
_DRAW_KIND = {"constant": None, "lognormal": "standard_normal", "gaussian": "standard_normal",
              "uniform": "random", "pareto": "random", "empirical": "random", "spliced": "random"}


def _single_kind(task: TaskSpec) -> str | None:
    """The one kind of draw a task's stream makes after its reset (env.step latency, failure,
    observation, response), or None when it mixes kinds or uses a distribution not listed."""
    kinds = set()
    for dist in (task.env.step, task.obs_tokens, task.response_tokens):
        kind = getattr(dist, "kind", "?")
        if kind not in _DRAW_KIND:
            return None
        kinds.add(_DRAW_KIND[kind])
    kinds.discard(None)
    return kinds.pop() if len(kinds) == 1 else None


@dataclass
class _EnvState:
    rng: np.random.Generator
    turns_total: int = 0
    turn: int = 0
    draws: Any = None  # after the reset: the stream, blocked when single-kind (_Block)
    fails: Any = None  # whether each call fails: a stream of its own (_EnvModel._fails)


class EnvModel:
    """Samples latency, failures and observations of env.reset / env.step.

    A call fails with probability ``failure_prob`` (after its latency) and times out when its
    latency exceeds ``timeout_s`` (the caller waits ``timeout_s``). The number of turns is drawn
    at the first successful reset; ``done`` is reported on the last one. Each trajectory has
    its own RNG seeded by (seed, trajectory id), so results do not depend on event order, and
    draws whether a call fails from a second one (seed, trajectory id, 1): a run with failures
    sees the same latencies and token counts as one without, so the two compare pair by pair."""

    def __init__(self, seed: int):
        self.seed = seed
        self._state: dict[int, _EnvState] = {}
        self._kinds: dict[str, str | None] = {}  # per task name: _single_kind

    def _draws(self, task: TaskSpec, st: _EnvState) -> Any:
        """What the trajectory draws from after its reset: its generator, or a block of it."""
        if st.draws is None:
            kind = self._kinds.get(task.name, "?")
            if kind == "?":
                kind = self._kinds[task.name] = _single_kind(task)
            st.draws = st.rng if kind is None else (
                _NormalBlock(st.rng, kind) if kind == "standard_normal" else _UniformBlock(st.rng, kind))
        return st.draws

    def _fails(self, traj_id: int, st: _EnvState) -> _UniformBlock:
        if st.fails is None:
            st.fails = _UniformBlock(np.random.default_rng([self.seed, traj_id, 1]), "random")
        return st.fails

    def rng(self, traj_id: int) -> np.random.Generator:
        st = self._state.get(traj_id)
        if st is None:
            st = self._state[traj_id] = _EnvState(np.random.default_rng([self.seed, traj_id]))
        return st.rng

    def _call(self, task: TaskSpec, traj_id: int, latency_dist, rng: Any = None,
              timeout_s: float | None = None) -> tuple[float, str | None]:
        rng = self.rng(traj_id) if rng is None else rng
        latency = latency_dist.sample(rng)
        limit = task.env.timeout_s if timeout_s is None else timeout_s
        if latency > limit:
            return limit, "timeout"
        if task.env.failure_prob and self._fails(traj_id, self._state[traj_id]).random() < task.env.failure_prob:
            return latency, "error"
        return latency, None

    def reset(self, task: TaskSpec, traj_id: int, timeout_s: float | None = None) -> tuple[float, EnvOutcome]:
        """A reset's latency and outcome. ``timeout_s``: what is left of the attempt's deadline
        (``task.env.timeout_s`` less the seconds its image pull took; the whole of it when omitted):
        a draw above it is a timeout that costs exactly it."""
        latency, err = self._call(task, traj_id, task.env.reset, timeout_s=timeout_s)
        if err:
            return latency, EnvOutcome(ok=False, error=err)
        st = self._state[traj_id]
        st.turns_total = max(1, round(task.turns.sample(st.rng)))
        st.turn = 0
        return latency, EnvOutcome(ok=True, obs_tokens=_prompt_tokens(task, st.rng))

    def step(self, task: TaskSpec, traj_id: int) -> tuple[float, EnvOutcome]:
        st = self._state.get(traj_id)
        if st is None or not st.turns_total:  # not reset (a caller outside the core's protocol)
            latency, err = self._call(task, traj_id, task.env.step)
            st = self._state[traj_id]
            rng = st.rng
        else:  # _call, inlined (the same draws in the same order): this runs at every turn
            rng = st.draws if st.draws is not None else self._draws(task, st)
            spec = task.env
            latency, err = spec.step.sample(rng), None
            if latency > spec.timeout_s:
                latency, err = spec.timeout_s, "timeout"
            elif spec.failure_prob and self._fails(traj_id, st).random() < spec.failure_prob:
                err = "error"
        if err:
            return latency, EnvOutcome(ok=False, error=err)
        st.turn += 1
        done = st.turn >= st.turns_total
        obs = 0 if done else max(0, round(task.obs_tokens.sample(rng)))
        return latency, EnvOutcome(ok=True, obs_tokens=obs, done=done)

    def image_cached(self, task: TaskSpec, image: int) -> bool:
        """Whether the pool finds ``image`` cached (probability ``image_cache_hit``): a stream of its
        own (seed, image, 3), so the cache changes no other draw, and one draw per image, so every
        env that runs the image sees the same answer."""
        hit = task.env.image_cache_hit
        if hit <= 0.0 or hit >= 1.0:
            return hit >= 1.0
        return bool(np.random.default_rng([self.seed, image, 3]).random() < hit)

    def rule_reward_s(self, task: TaskSpec, traj_id: int) -> float:
        """Seconds the trajectory's rule reward takes: a third stream (seed, id, 2), drawn from only
        when the task's distribution draws at all, so the default constant changes no other draw."""
        dist = task.rule_reward_s
        if getattr(dist, "kind", None) == "constant":
            return dist.sample(None)  # type: ignore[arg-type]
        return dist.sample(np.random.default_rng([self.seed, traj_id, 2]))

    def response_tokens(self, task: TaskSpec, traj_id: int, limit: int) -> int:
        st = self._state.get(traj_id)
        if st is not None and st.turns_total:
            rng = st.draws if st.draws is not None else self._draws(task, st)
        else:
            rng = self.rng(traj_id)
        return max(1, min(limit, round(task.response_tokens.sample(rng))))

    def forget(self, traj_id: int) -> None:
        self._state.pop(traj_id, None)
