"""Context variables set for the length of a block (the trace context, the session scope)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")


@contextmanager
def scoped(var: ContextVar[T | None], value: T) -> Iterator[T]:
    """Set ``var`` to ``value`` within the block; the value it had comes back after it."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)
