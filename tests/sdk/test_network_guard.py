from __future__ import annotations

import socket
import threading

import pytest

from evoharness.sdk.testing import NetworkBlockedError, block_network


def test_non_loopback_is_blocked_by_default() -> None:
    s = socket.socket()
    try:
        with pytest.raises(NetworkBlockedError) as err:
            s.connect(("192.0.2.1", 80))  # TEST-NET-1: never routed, and blocked before send
        assert "allow_network" in str(err.value)
        with pytest.raises(NetworkBlockedError):
            s.connect_ex(("192.0.2.1", 80))
    finally:
        s.close()


def test_loopback_is_allowed() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        accepted.append(conn.recv(5))
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(b"hello")
    t.join(5)
    server.close()
    assert accepted == [b"hello"]


def test_guard_restores_socket_methods() -> None:
    before = socket.socket.connect
    with block_network():
        assert socket.socket.connect is not before
    assert socket.socket.connect is before
