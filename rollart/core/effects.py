"""Effects: what a control-plane process asks its backend to do.

Core processes are generators that ``yield`` one of these and receive the result back.
The simulator turns each into SimPy events priced by cost models; the runtime turns each
into a call on a real worker. Nothing here knows which backend is listening.

They are plain slotted dataclasses, treated as immutable once yielded but not ``frozen``: a
frozen dataclass sets each field through ``object.__setattr__`` (about 4× the construction
cost), and a paper-scale simulated step builds ~30 k of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generator, Hashable

if TYPE_CHECKING:
    from rollart.core.signals import Signal
    from rollart.core.trajectory import Trajectory


# --------------------------------------------------------------- environment


@dataclass(slots=True)
class AcquireEnv:
    """Hold what the trajectory's environment needs for its whole life (CPU cores in the
    simulator; nothing to wait for on the real env workers) → None once held. Released by
    :class:`EnvClose`."""

    traj: "Trajectory"


@dataclass(slots=True)
class EnvReset:
    """Start (or restart after a failure) the environment of a trajectory → :class:`EnvOutcome`."""

    traj: "Trajectory"
    attempt: int = 0


@dataclass(slots=True)
class EnvStep:
    """Apply the last action to the environment → :class:`EnvOutcome`."""

    traj: "Trajectory"
    attempt: int = 0


@dataclass(slots=True)
class EnvClose:
    """Release the trajectory's environment (CPU slot, container, prefix-cache entries)."""

    traj: "Trajectory"


@dataclass(slots=True)
class EnvOutcome:
    ok: bool
    obs_tokens: int = 0
    done: bool = False
    error: str | None = None  # "timeout" | "error: ..." when not ok


# --------------------------------------------------------------- generation


@dataclass(slots=True)
class Generate:
    """One turn of generation on ``worker`` (after prefill on ``prefill_worker`` when PD is on)
    → :class:`GenOutcome`. ``context_tokens`` is the whole history sent to the model."""

    traj: "Trajectory"
    worker: int
    context_tokens: int
    max_new_tokens: int
    prefill_worker: int | None = None


@dataclass(slots=True)
class GenOutcome:
    tokens: int
    text: str | None = None  # real backends return the action text


# --------------------------------------------------------------- reward & training


@dataclass(slots=True)
class ComputeReward:
    """Score a finished trajectory (rule in-process, or an LLM judge) → float."""

    traj: "Trajectory"
    serverless: bool


@dataclass(slots=True)
class TrainStep:
    """One optimiser step on a batch; the trainer's version becomes ``version + 1``."""

    batch: tuple["Trajectory", ...]
    version: int


# --------------------------------------------------------------- weight sync


@dataclass(slots=True)
class BroadcastWeights:
    """Synchronous transfer (NCCL broadcast) of ``version`` from the trainer to every worker."""

    version: int
    workers: tuple[int, ...]


@dataclass(slots=True)
class PublishWeights:
    """Cut ``version`` into buckets, publish them once to the store over the cross-cluster link,
    and let every worker pull them; returns when all workers hold the version in host memory."""

    version: int
    workers: tuple[int, ...]


@dataclass(slots=True)
class UpdateWeights:
    """Swap ``version`` into the engines of ``workers`` and recompute the KV cache of their
    in-flight requests (steps ③ and ⑤); ``from_host`` when the weights were pulled to host memory."""

    version: int
    workers: tuple[int, ...]
    from_host: bool


# --------------------------------------------------------------- control


@dataclass(slots=True)
class Wait:
    """Block until ``signal`` fires; returns the value it fired with."""

    signal: "Signal"


@dataclass(slots=True)
class Sleep:
    seconds: float


@dataclass(slots=True)
class Spawn:
    """Start ``process`` concurrently; ``key`` lets a later :class:`Abort` find it."""

    process: Generator[Any, Any, Any]
    key: Hashable | None = None


@dataclass(slots=True)
class Abort:
    """Cancel the processes of these trajectories: each receives :class:`Aborted` at its
    current effect (an in-flight generation is ABORTed on its engine)."""

    trajs: tuple["Trajectory", ...]
    reason: str


class Aborted(Exception):
    """Thrown into a trajectory's process when another process aborted it. ``partial_tokens``: when
    it was aborted in a :class:`Generate`, the tokens its engine had decoded for that turn so far
    (work done and thrown away); None where the backend cannot tell (the Ray runtime cancels the
    request without its partial output)."""

    def __init__(self, reason: str = "", partial_tokens: int | None = None) -> None:
        super().__init__(reason)
        self.partial_tokens = partial_tokens
