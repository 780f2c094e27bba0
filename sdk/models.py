"""Resolve a ``--model`` spec into a LangChain chat model."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from langchain_core.language_models import BaseChatModel

from evoharness.harness import ConfigError
from evoharness.sdk.environment import Environment


def model_factory(
    spec: str, env: Environment, *, base_url: str | None = None, api_key_env: str | None = None
) -> Callable[[], BaseChatModel]:
    """Return a factory for ``spec``.

    ``offline`` is the environment's SIMULATED policy (a fresh model per session);
    ``openai:<name>`` is ChatOpenAI (``base_url`` for any OpenAI-compatible server such as
    vLLM); any other ``provider:name`` goes through ``langchain.chat_models.init_chat_model``.
    The API key is read from the environment variable ``api_key_env`` (never from argv, so it
    never lands in shell history, traces or logs).
    """
    if spec == "offline":
        return env.offline_model
    provider, sep, name = spec.partition(":")
    if not sep or not name:
        raise ConfigError(
            f"bad --model {spec!r}: use 'offline', 'openai:<model>' or '<provider>:<model>'",
            field="model",
        )
    api_key = os.environ.get(api_key_env) if api_key_env else None
    if api_key_env and api_key is None:
        raise ConfigError(f"environment variable {api_key_env} is not set", field="api_key_env")
    try:
        if provider == "openai":
            from langchain_openai import ChatOpenAI

            extra: dict[str, object] = {"base_url": base_url} if base_url else {}
            if api_key is not None:
                extra["api_key"] = api_key
            elif base_url and "OPENAI_API_KEY" not in os.environ:
                extra["api_key"] = "unused"  # local OpenAI-compatible servers ignore the key
            shared: BaseChatModel = ChatOpenAI(model=name, temperature=0, **extra)
        else:
            from langchain.chat_models import init_chat_model

            options: dict[str, Any] = {"base_url": base_url} if base_url else {}
            shared = init_chat_model(spec, temperature=0, **options)
    except ConfigError:
        raise
    except Exception as exc:  # missing credentials, unknown provider, missing package
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot create model {spec!r}: {first_line}", field="model") from exc
    return lambda: shared
