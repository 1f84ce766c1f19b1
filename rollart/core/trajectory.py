"""A trajectory's record and its GRPO group. Every trajectory ends in exactly one state."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class TrajState(enum.Enum):
    RUNNING = "running"                      # in flight: env, generation or reward
    SCORED = "scored"                        # reward done, waiting in the SampleBuffer
    USED = "used"                            # consumed by a training batch
    ABORTED_STALE = "aborted_stale"          # fell out of the α window
    ABORTED_REDUNDANT = "aborted_redundant"  # surplus of redundant rollout, group already full
    FAILED = "failed"                        # env failed or timed out after its retries

    @property
    def terminal(self) -> bool:
        return self in (TrajState.USED, TrajState.ABORTED_STALE, TrajState.ABORTED_REDUNDANT, TrajState.FAILED)


# Time categories of a trajectory's life, used for the step breakdown.
GEN, ENV_RESET, ENV_STEP, REWARD, WEIGHT_SYNC = "generation", "env_reset", "env_step", "reward", "weight_sync"
ENV_QUEUE = "env_queue"  # waiting for the CPU pool's cores before env.reset


@dataclass(eq=False)
class Trajectory:
    id: int
    group: "Group"
    task: str
    tag: str
    start_version: int
    started_at: float
    state: TrajState = TrajState.RUNNING
    turns: int = 0
    context_tokens: int = 0
    generated_tokens: int = 0
    reward: float | None = None
    finished_at: float | None = None
    last_worker: int | None = None
    last_prefill_worker: int | None = None  # PD: the prefill worker whose prefix cache holds this conversation
    error: str | None = None
    # (start, end, category) spans; kept until the trajectory is reported so the step
    # breakdown can follow the critical path.
    segments: list[tuple[float, float, str]] = field(default_factory=list)
    # Sync's reward-after-batch gate: when this trajectory reached it (its rollout done) and when
    # the gate let it through, so the breakdown can follow the member the gate waited for.
    reward_gate: tuple[float, float] | None = None
    # (from, to): its admission was held back until the workers served newer weights (α); it would have
    # started at ``from``, so the step it finishes last counts that lost head start as weight sync
    held_for_weights: tuple[float, float] | None = None

    def record(self, start: float, end: float, category: str) -> None:
        if end > start:
            self.segments.append((start, end, category))

    def __repr__(self) -> str:
        return f"Trajectory(id={self.id}, task={self.task}, v={self.start_version}, {self.state.value})"


@dataclass(eq=False)
class Group:
    """One prompt's GRPO group: complete once ``size`` members are scored."""

    id: int
    task: str
    version: int  # policy version when the group was admitted; bounds every member's staleness
    size: int
    batch_index: int  # which rollout batch admitted it (batch-level modes)
    slot: int | None = None  # its env group (ROLLART: ROLL's fixed env groups, one task each), else None
    members: list[Trajectory] = field(default_factory=list)
    scored: list[Trajectory] = field(default_factory=list)
    refills: int = 0
    # the critical-path spans of failed members whose refill has not started yet: a refill continues its
    # predecessor's path, so the time the failed attempt took reads as what it was, not as idle
    failed_paths: list[list[tuple[float, float, str]]] = field(default_factory=list)
    complete: bool = False
    abandoned: bool = False  # ran out of refills
    evicted: bool = False    # fell out of the α window
    consumed: bool = False
    completed_at: float | None = None

    @property
    def running(self) -> list[Trajectory]:
        return [t for t in self.members if t.state is TrajState.RUNNING]

    @property
    def live(self) -> bool:
        """Still holds a slot of the rollout budget (open, buffered or consumed)."""
        return not (self.abandoned or self.evicted)
