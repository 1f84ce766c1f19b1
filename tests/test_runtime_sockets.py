"""The one loopback test every runtime check uses (listening sockets, --address, reward URLs)."""

from __future__ import annotations

import pytest

from rollart.runtime.cluster import _is_loopback_address
from rollart.runtime.reward.serverless import _is_loopback
from rollart.runtime.sockets import Listener, is_loopback_host


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("::ffff:127.0.0.1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("192.0.2.2", False), ("::ffff:10.0.0.1", False), ("example.com", False),
    ("", False), ("127.0.0.1.evil", False),
])
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_addresses_urls_and_listeners_share_it() -> None:
    assert _is_loopback_address("127.0.0.1:6379") and _is_loopback_address("[::1]:8265")
    assert not _is_loopback_address("192.0.2.2:6379") and not _is_loopback_address("0.0.0.0:6379")
    assert _is_loopback("http://127.0.0.1:8000/reward") and _is_loopback("http://localhost/r")
    assert not _is_loopback("http://10.1.2.3:8000/reward")
    assert Listener("::ffff:127.0.0.1", 1, (), ()).loopback and not Listener("0.0.0.0", 1, (), ()).loopback
