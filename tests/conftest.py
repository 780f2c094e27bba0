"""Shared fixtures: a real Redis for the Redis backends, mandatory in CI."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

REDIS_URL = os.environ.get("EVOHARNESS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session", autouse=True)
def _outside_the_working_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run the suite from a temporary directory: default paths (``.evoharness/traces.db``,
    ``.evoharness/cold``, ...) resolve there, so no test writes into the repository and no
    later ``evolve cycle`` learns from test traces. Tests find repository files through
    ``Path(__file__)``."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        yield
    finally:
        os.chdir(before)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def redis_url() -> str:
    """URL of a live Redis: fails in CI when none answers, skips (visibly) elsewhere."""
    try:
        import redis
    except ImportError:  # pragma: no cover - dev extra installs it
        if _in_ci():
            pytest.fail("redis package missing in CI: pip install 'evoharness[redis]'")
        pytest.skip("redis package not installed: pip install 'evoharness[redis]'")
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except Exception as exc:
        if _in_ci():
            pytest.fail(f"Redis is mandatory in CI but {REDIS_URL} did not answer: {exc}")
        pytest.skip(f"no Redis at {REDIS_URL} ({exc}); Redis tests run in CI")
    return REDIS_URL


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A unique key prefix; deletes only its own keys afterwards (the server is shared)."""
    import redis

    prefix = f"evoharness-test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client: Any = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
