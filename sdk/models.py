"""Resolve a ``--model`` spec into a LangChain chat model, and check its endpoint first."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from langchain_core.language_models import BaseChatModel

from evoharness.harness import ConfigError, RunError
from evoharness.sdk.environment import Environment

OPENAI_DEFAULT_URL = "https://api.openai.com/v1"


class EndpointUnreachableError(RunError):
    """The model endpoint did not answer before any task was started.

    Attributes:
        url: The endpoint that was tried.
        cause: The transport error, in one line.
    """

    def __init__(self, message: str, *, url: str, cause: str) -> None:
        super().__init__(message)
        self.url = url
        self.cause = cause


def model_factory(
    spec: str,
    env: Environment,
    *,
    base_url: str | None = None,
    api_key_env: str | None = None,
    timeout_s: float | None = None,
    max_retries: int | None = None,
) -> Callable[[], BaseChatModel]:
    """Return a factory for ``spec``.

    ``offline`` is the environment's SIMULATED policy (a fresh model per session);
    ``openai:<name>`` is ChatOpenAI (``base_url`` for any OpenAI-compatible server such as
    vLLM); any other ``provider:name`` goes through ``langchain.chat_models.init_chat_model``.
    The API key is read from the environment variable ``api_key_env`` (never from argv, so it
    never lands in shell history, traces or logs). ``timeout_s`` bounds each request and
    ``max_retries`` the client's own retries (``None``: the provider's defaults).
    """
    if spec == "offline":
        return env.offline_model
    provider, sep, name = spec.partition(":")
    if not sep or not name:
        raise ConfigError(
            f"bad --model {spec!r}: use 'offline', 'openai:<model>' or '<provider>:<model>'",
            field="model",
        )
    if timeout_s is not None and timeout_s <= 0:
        raise ConfigError(f"--timeout must be > 0 seconds, got {timeout_s}", field="timeout")
    if max_retries is not None and max_retries < 0:
        raise ConfigError(f"--max-retries must be >= 0, got {max_retries}", field="max_retries")
    api_key = os.environ.get(api_key_env) if api_key_env else None
    if api_key_env and api_key is None:
        raise ConfigError(f"environment variable {api_key_env} is not set", field="api_key_env")
    limits: dict[str, Any] = {}
    if timeout_s is not None:
        limits["timeout"] = timeout_s
    if max_retries is not None:
        limits["max_retries"] = max_retries
    try:
        if provider == "openai":
            from langchain_openai import ChatOpenAI

            extra: dict[str, Any] = {"base_url": base_url} if base_url else {}
            if api_key is not None:
                extra["api_key"] = api_key
            elif base_url and "OPENAI_API_KEY" not in os.environ:
                extra["api_key"] = "unused"  # local OpenAI-compatible servers ignore the key
            shared: BaseChatModel = ChatOpenAI(model=name, temperature=0, **extra, **limits)
        else:
            from langchain.chat_models import init_chat_model

            options: dict[str, Any] = {"base_url": base_url} if base_url else {}
            shared = init_chat_model(spec, temperature=0, **options, **limits)
    except ConfigError:
        raise
    except Exception as exc:  # missing credentials, unknown provider, missing package
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot create model {spec!r}: {first_line}", field="model") from exc
    return lambda: shared


def endpoint_of(spec: str, base_url: str | None = None) -> str | None:
    """The HTTP endpoint a model spec talks to, when it is known (``None`` for offline
    models and providers whose endpoint is chosen by their own SDK)."""
    if spec == "offline":
        return None
    if base_url:
        return base_url
    if spec.partition(":")[0] == "openai":
        return os.environ.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_URL
    return None


def preflight(spec: str, *, base_url: str | None = None, timeout_s: float = 10.0) -> str | None:
    """Check that the model endpoint answers at all, before any task is started.

    One ``GET <endpoint>/models``: a server that accepts the connection is there, whatever
    it answers (401, 404, or nothing before ``timeout_s``); a refused connection, an
    unknown host or a connect timeout raises :class:`EndpointUnreachableError`. Nothing is
    generated, so it costs no tokens.

    Returns:
        The endpoint checked, or ``None`` when there is none to check.
    """
    url = endpoint_of(spec, base_url)
    if url is None:
        return None
    import httpx  # a dependency of the openai client

    try:
        httpx.get(url.rstrip("/") + "/models", timeout=timeout_s)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as exc:
        cause = f"{type(exc).__name__}: {str(exc).strip() or 'no answer'}".splitlines()[0]
        raise EndpointUnreachableError(
            f"cannot reach the model endpoint {url} ({cause}); start the server or fix "
            "--base-url (--no-preflight skips this check)",
            url=url,
            cause=cause,
        ) from exc
    except httpx.TransportError:
        pass  # connected: the server is there, slow or odd answers are the run's business
    return url
