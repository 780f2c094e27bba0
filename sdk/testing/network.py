"""Block outbound network access except loopback, for offline-by-construction tests."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from evoharness.harness import EvoharnessError


class NetworkBlockedError(EvoharnessError, ConnectionError):
    """A test tried to reach a non-loopback address while the network guard was on.

    Attributes:
        address: The address the code tried to connect to.
    """

    def __init__(self, address: object) -> None:
        super().__init__(
            f"network access to {address!r} is blocked in tests (only loopback is allowed); "
            "mark the test with @pytest.mark.allow_network if it really needs the network"
        )
        self.address = address


def _is_loopback(address: object) -> bool:
    if isinstance(address, (str, bytes)):  # AF_UNIX paths are local by definition
        return True
    if not isinstance(address, tuple) or not address:
        return False
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def block_network() -> Iterator[None]:
    """Within the block, sockets may only connect to loopback or Unix-domain addresses."""
    original_connect = socket.socket.connect
    original_connect_ex = socket.socket.connect_ex

    def guarded_connect(self: socket.socket, address: Any) -> None:
        if not _is_loopback(address):
            raise NetworkBlockedError(address)
        original_connect(self, address)

    def guarded_connect_ex(self: socket.socket, address: Any) -> int:
        if not _is_loopback(address):
            raise NetworkBlockedError(address)
        return original_connect_ex(self, address)

    socket.socket.connect = guarded_connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        socket.socket.connect = original_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = original_connect_ex  # type: ignore[method-assign]
