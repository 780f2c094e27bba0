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
from langchain_core.runnables.config import run_in_executor


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

    def _result(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        """One call's result: the reply as LangChain's generation."""
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages, **kwargs))])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._result(messages, **kwargs)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # not through self._generate: a subclass that wraps both hooks would wrap one call
        # twice (a token-counting wrapper counted the bound tools twice per async call)
        if self.blocking:  # as LangChain's default does: in the default executor
            return await run_in_executor(None, self._result, messages, **kwargs)
        return self._result(messages, **kwargs)
