"""What a failed Langfuse read becomes: one error that names the host and the fix.

The SDK's API client raises httpx's transport errors (``ReadTimeout``, ``ConnectError``) and
its own ``ApiError`` (an HTTP status) as they are; a monitor or a cycle reading Langfuse
turns them into :class:`LangfuseReadError`, which a CLI prints as one line.
"""

from __future__ import annotations

from typing import Any

import httpx

from evoharness.harness.errors import RunError

__all__ = ["LangfuseReadError", "base_url_of", "read_error"]


class LangfuseReadError(RunError):
    """Langfuse did not answer a read, or refused it.

    Attributes:
        host: The Langfuse base URL read from.
        status: The HTTP status (0: no answer).
    """

    def __init__(self, message: str, *, host: str, status: int = 0) -> None:
        super().__init__(message)
        self.host = host
        self.status = status


def base_url_of(api: Any) -> str:
    """The base URL a ``langfuse.api.LangfuseAPI`` client talks to (``?`` if it hides it)."""
    wrapper = getattr(api, "_client_wrapper", None)
    get = getattr(wrapper, "get_base_url", None)
    try:
        return str(get()) if callable(get) else "?"
    except Exception:  # a stand-in client: the message just names no host
        return "?"


def read_error(exc: BaseException, *, host: str, what: str) -> LangfuseReadError | None:
    """The project error for a failed read of ``what`` (``None``: not a Langfuse failure)."""
    detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
    if isinstance(exc, httpx.TimeoutException):
        return LangfuseReadError(
            f"Langfuse at {host} did not answer the read of {what} in time ({detail}): check "
            "that the server is up and not overloaded, narrow the read (a shorter window), or "
            "give the API client a longer timeout (LangfuseAPI(timeout=...))",
            host=host,
        )
    if isinstance(exc, httpx.HTTPError):
        return LangfuseReadError(
            f"Langfuse at {host} could not be reached to read {what} ({detail}): check the "
            "host (LANGFUSE_BASE_URL) and that the server is up and reachable from here",
            host=host,
        )
    status = getattr(exc, "status_code", None)
    if type(exc).__module__.startswith("langfuse") and isinstance(status, int):
        if status in (401, 403):
            fix = (
                "check that LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY are a key pair of "
                "a project on this host"
            )
        else:
            fix = "check the server's logs; a read can be retried"
        body = " ".join(str(getattr(exc, "body", "")).split())[:200]
        return LangfuseReadError(
            f"Langfuse at {host} refused the read of {what} (HTTP {status}: {body}): {fix}",
            host=host,
            status=status,
        )
    return None
