"""Pytest plugin: every test runs with outbound network blocked except loopback.

Enable it with ``-p evoharness.sdk.testing.pytest_plugin`` (or ``pytest_plugins`` in a
conftest). Mark a test ``@pytest.mark.allow_network`` to lift the guard for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from evoharness.sdk.testing.network import block_network


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker so ``--strict-markers`` accepts it."""
    config.addinivalue_line("markers", "allow_network: lift the loopback-only network guard")


@pytest.fixture(autouse=True)
def _evoharness_network_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("allow_network") is not None:
        yield
        return
    with block_network():
        yield
