"""The engine interface an inference worker drives between commands.

An engine holds requests; ``step()`` runs one engine iteration (a prefill for new requests
and/or one decode token for running ones) and returns the requests that finished. Commands
(``add``, ``abort``, ``load_weights``) are applied by the worker between steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol


@dataclass
class Completion:
    request_id: str
    token_ids: list[int]           # generated tokens (without the prompt)
    text: str
    logprobs: list[float] = field(default_factory=list)  # log p of each generated token (behaviour policy)
    finish_reason: str = "length"  # "stop" | "length" | "abort"


class Engine(Protocol):
    name: str

    def add(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, temperature: float = 1.0,
            seed: int | None = None) -> None: ...

    def abort(self, request_id: str) -> bool:
        """Drop a request; True if it was queued or running."""
        ...

    def step(self) -> list[Completion]:
        """One iteration; returns requests that finished in it."""
        ...

    def has_work(self) -> bool: ...

    def load_weights(self, state: Mapping[str, Any]) -> None:
        """Replace the weights; running requests recompute their KV cache before the next step."""
        ...

    def state_dict(self) -> dict[str, Any]: ...
