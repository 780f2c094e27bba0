"""A Langfuse read that fails (no answer in time, nothing listening, keys refused) is a
LangfuseReadError naming the host and the fix, not an httpx traceback: the real langfuse SDK
against loopback servers the test starts."""

from __future__ import annotations

import pickle
import socket
import threading
from collections.abc import Iterator

import pytest

from evoharness.evolve.episodes import LangfuseReadError, LangfuseTraceSource
from evoharness.evolve.monitor import DriftConfig, run_monitor
from evoharness.harness import EvoharnessError

pytest.importorskip("langfuse", reason="needs `pip install 'evoharness[langfuse]'`")


def api(base_url: str, *, keys: bool = True, timeout: float = 0.5) -> object:
    from langfuse.api import LangfuseAPI

    creds = {"username": "pk-lf-read", "password": "sk-lf-read"} if keys else {}
    return LangfuseAPI(base_url=base_url, timeout=timeout, **creds)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers (a server stuck under load)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_a_read_that_times_out_names_the_host_and_the_fix(silent_server: str) -> None:
    source = LangfuseTraceSource(api(silent_server, timeout=0.3))
    with pytest.raises(LangfuseReadError) as info:
        list(source.episodes())
    err = info.value
    assert isinstance(err, EvoharnessError) and err.host == silent_server and err.status == 0
    assert silent_server in str(err) and "did not answer" in str(err)
    assert "ReadTimeout" in str(err) and "timeout" in str(err)
    assert pickle.loads(pickle.dumps(err)).host == silent_server
    # the monitor reading that source says the same (its CLI prints it as one line)
    with pytest.raises(LangfuseReadError, match="did not answer"):
        run_monitor(source, config=DriftConfig())


def test_a_host_nobody_listens_on_is_named() -> None:
    from evoharness.sdk.testing.langfuse_standin import free_port

    host = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(LangfuseReadError, match="could not be reached") as info:
        list(LangfuseTraceSource(api(host)).episodes())
    assert host in str(info.value) and "LANGFUSE_BASE_URL" in str(info.value)


def test_refused_keys_are_named() -> None:
    from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

    with LangfuseStandIn() as lf:
        with pytest.raises(LangfuseReadError) as info:
            list(LangfuseTraceSource(api(lf.base_url, keys=False)).episodes())
        assert info.value.status == 401 and lf.base_url in str(info.value)
        assert "LANGFUSE_PUBLIC_KEY" in str(info.value)
        assert list(LangfuseTraceSource(api(lf.base_url)).episodes()) == []  # keys: fine
