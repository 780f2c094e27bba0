"""A deterministic chat model for tests, benchmarks and offline demos."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr, field_validator

from evoharness.harness import RunError, approx_message_tokens
from evoharness.sdk._reply_model import ReplyChatModel

Reply = AIMessage | str
Policy = Callable[[list[BaseMessage]], Reply]
CountTokens = Callable[[Sequence[BaseMessage]], int]
"""How a scripted reply's ``usage_metadata`` is counted (messages in, tokens out)."""


class ScriptExhaustedError(RunError):
    """A :class:`~evoharness.sdk.testing.ScriptedChatModel` was called after its last reply.

    Attributes:
        calls: How many calls the script answered before running out.
    """

    def __init__(self, calls: int) -> None:
        super().__init__(
            f"ScriptedChatModel ran out of scripted replies after {calls} call(s); "
            "add replies to the script or pass a policy callable."
        )
        self.calls = calls


class ScriptedChatModel(ReplyChatModel):
    """A LangChain chat model that plays a script of replies or a policy callable.

    Replies are ``AIMessage`` objects (text and/or ``tool_calls``) or plain strings. With a
    ``policy`` the model instead calls ``policy(messages)`` for every turn, which lets a test
    or simulator react to tool results. Every reply carries ``usage_metadata`` computed by
    ``token_counter`` so budget and tracing code sees realistic numbers.

    The model is safe to share between concurrent sessions only with a policy (a script is a
    single global sequence). It fails loudly with :class:`ScriptExhaustedError` when the script
    runs out.

    Example:
        >>> from langchain_core.messages import AIMessage
        >>> model = ScriptedChatModel(script=[
        ...     AIMessage(content="", tool_calls=[{"name": "add", "args": {"a": 1}, "id": "c1",
        ...                                "type": "tool_call"}]),
        ...     "done",
        ... ])
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: list[Any] = Field(default_factory=list)
    """Replies played in order, one per model call (``AIMessage`` or ``str``)."""
    policy: Policy | None = None
    """Callable producing the reply from the messages; takes precedence over ``script``."""
    token_counter: CountTokens = approx_message_tokens
    """Counts tokens for ``usage_metadata``; the default is the harness approximation."""
    model_name: str = "scripted"
    blocking: ClassVar[bool] = False  # a reply is read from the script: answered inline

    _cursor: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _calls: list[list[BaseMessage]] = PrivateAttr(default_factory=list)
    _bound_tools: list[str] = PrivateAttr(default_factory=list)

    @field_validator("script")
    @classmethod
    def _check_script(cls, script: list[Any]) -> list[Any]:
        for i, reply in enumerate(script):
            if not isinstance(reply, AIMessage | str):
                raise ValueError(
                    f"script[{i}] is a {type(reply).__name__}; use an AIMessage or a str"
                )
        return script

    @property
    def _llm_type(self) -> str:
        return "evoharness-scripted"

    @property
    def calls(self) -> list[list[BaseMessage]]:
        """The message lists this model received, one per call, in order."""
        return list(self._calls)

    @property
    def bound_tool_names(self) -> list[str]:
        """Names of the tools most recently bound with :meth:`bind_tools`."""
        return list(self._bound_tools)

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Record the tools and bind their OpenAI schemas, as a real provider model would."""
        schemas = [convert_to_openai_tool(t) for t in tools]
        self._bound_tools = [s["function"]["name"] for s in schemas]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=schemas, **kwargs)

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> AIMessage:
        return self._next_reply(messages)

    def _next_reply(self, messages: list[BaseMessage]) -> AIMessage:
        """The next scripted (or policy) reply, with its usage counted."""
        with self._lock:
            self._calls.append(list(messages))
            if self.policy is None:
                if self._cursor >= len(self.script):
                    raise ScriptExhaustedError(self._cursor)
                reply: Reply = self.script[self._cursor]
                self._cursor += 1
        if self.policy is not None:
            reply = self.policy(list(messages))
        message = AIMessage(content=reply) if isinstance(reply, str) else reply.model_copy()
        prompt = self.token_counter(messages)
        completion = self.token_counter([message])
        message.usage_metadata = {
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": prompt + completion,
        }
        message.response_metadata = {**message.response_metadata, "model_name": self.model_name}
        return message
