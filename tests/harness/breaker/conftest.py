"""A private redis-server per test, which the test may kill, pause or reconfigure."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")


@pytest.fixture
def own_redis(redis_url: str) -> Iterator[dict[str, Any]]:
    """``{"port", "proc", "start", "free_port"}``: a private redis-server on a free port;
    ``box["proc"] = box["start"]()`` restarts it (empty) on the same port."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server binary is needed to test outages (apt-get install redis-server)")
    port = free_port()
    box: dict[str, Any] = {"port": port, "proc": start_redis(port), "free_port": free_port}
    box["start"] = lambda: start_redis(port)
    yield box
    box["proc"].kill()  # SIGKILL also ends a SIGSTOPped server
    box["proc"].wait()
