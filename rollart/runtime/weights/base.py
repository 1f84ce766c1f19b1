"""The weight-store interface: the trainer publishes a version once, workers pull it."""

from __future__ import annotations

from typing import Any, Protocol


class WeightStore(Protocol):
    name: str

    def publish(self, version: int, state: dict[str, Any], bucket_bytes: int) -> dict[str, float]:
        """Cut ``state`` into buckets of at most ``bucket_bytes`` and store them under ``version``;
        returns timing figures (seconds, bytes)."""
        ...

    def pull(self, version: int) -> dict[str, Any]:
        """Reassemble ``version`` (blocks until it is published)."""
        ...

    def close(self) -> None: ...
