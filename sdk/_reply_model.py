"""The base of evoharness's own chat models: one reply message per call.

The scripted test model and the locally served one each build one ``AIMessage`` from the
messages; :class:`ReplyChatModel` turns it into LangChain's generation result, once for both,
and for both the sync and the async call.
"""

from __future__ import annotations

from typing import Any, ClassVar

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult


class ReplyChatModel(BaseChatModel):
    """A chat model whose subclass writes :meth:`_reply`, the one message a call returns.

    Attributes:
        blocking: Whether :meth:`_reply` blocks (computes on the calling thread, as a model
            served in this process does): an async call then runs it in a worker thread,
            off the event loop. ``False`` (a reply read from a script) answers inline.
    """

    blocking: ClassVar[bool] = True

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> AIMessage:
        """The reply to ``messages`` (``kwargs``: the call's, e.g. the bound ``tools``)."""
        raise NotImplementedError

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages, **kwargs))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.blocking:  # LangChain's default: _generate in the default executor
            return await super()._agenerate(messages, stop, run_manager, **kwargs)
        return self._generate(messages, stop, **kwargs)
