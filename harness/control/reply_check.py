"""Reply check (post_reflect): replies that would end a run silently.

* A tool call whose arguments did not parse lands in ``invalid_tool_calls``; a reply with
  only such calls looks like a final answer (usually an empty one), so the run ends as if
  it succeeded and the model is never told. The check turns each malformed call into a
  call that gets an error observation naming the parse problem, as LangChain does for
  arguments that fail validation, so the model can send it again (at most ``max_retries``
  times per user turn; then the run ends with a reply that says why). This also keeps the
  history valid for providers, which reject an assistant tool call without a result.
* An empty reply, or one cut off at the token limit (``finish_reason == "length"``,
  ``stop_reason == "max_tokens"``), is recorded; when a terminal tool is configured the
  model is nudged once, in the same model call, to finish with it.

What was done is recorded as events (``tool_call_malformed``, ``reply_empty``,
``reply_truncated``, ``reply_nudged``; ``reply_check_failed`` when the run ends on such a
reply, which trace exports show at warning level). The raw malformed calls are kept on the
reply (``response_metadata["evoharness_malformed"]``), so the decision is read off the
history: nothing is kept in the middleware, and a resumed checkpoint behaves the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from pydantic import BaseModel, ConfigDict, Field

from evoharness.harness._messages import ToolResult, current_turn, text_of, with_note
from evoharness.harness.events import EventLog

MALFORMED_KEY = "evoharness_malformed"
"""Where a converted reply keeps its malformed calls (``response_metadata``)."""

Problem = Literal["malformed", "empty", "truncated"]
_RAW_CHARS = 300


class ReplyCheckConfig(BaseModel):
    """Options of :class:`ReplyCheckMiddleware`.

    Attributes:
        max_retries: Replies with only malformed tool calls answered with an error
            observation per user turn; the next one ends the run with a reply that says
            why. Malformed calls beside valid ones are always answered (the run goes on
            anyway).
        nudge: Ask once for the terminal tool after an empty or cut-off final reply
            (only when a terminal tool is configured).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_retries: int = Field(2, ge=0)
    nudge: bool = True


def problem_of(reply: AIMessage) -> Problem | None:
    """What is wrong with ``reply``, if anything (cheap: runs on every model reply)."""
    if reply.invalid_tool_calls:
        return "malformed"
    meta = reply.response_metadata
    if meta.get("finish_reason") == "length" or meta.get("stop_reason") == "max_tokens":
        return "truncated"
    if not reply.tool_calls and not text_of(reply).strip():
        return "empty"
    return None


def malformed_in_turn(messages: Sequence[AnyMessage]) -> int:
    """Replies of the current turn whose only tool calls were malformed (and answered)."""
    return sum(
        1
        for m in current_turn(messages)
        if isinstance(m, AIMessage)
        and MALFORMED_KEY in m.response_metadata
        and all(c["id"] in _ids(m) for c in m.tool_calls)
    )


def _ids(message: AIMessage) -> set[str]:
    return {str(c["id"]) for c in message.response_metadata.get(MALFORMED_KEY, [])}


def parse_error_text(name: str | None, raw: str | None, error: str | None) -> str:
    """The observation the model gets for a malformed call."""
    what = f"your call of {name}" if name else "your tool call (it had no tool name)"
    shown = (raw or "")[:_RAW_CHARS]
    return (
        f"Error: the arguments of {what} could not be parsed"
        f"{f' ({error.strip()})' if error and error.strip() else ''}. Received: {shown!r}. "
        "Send the call again with the arguments as one valid JSON object."
    )


class ReplyCheckMiddleware(AgentMiddleware[Any, Any, Any]):
    """Answer malformed tool calls with an error observation; record and nudge empty or
    cut-off replies.

    Args:
        config: Retries and nudging (see :class:`ReplyCheckConfig`).
        terminal_tool: The tool that ends a run; without one, empty and cut-off replies
            are only recorded.
        events: Receives the events listed in the module docs.
    """

    def __init__(
        self,
        config: ReplyCheckConfig | None = None,
        *,
        terminal_tool: str | None = None,
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        self.config = config or ReplyCheckConfig()
        self.terminal_tool = terminal_tool
        self.events = events or EventLog()

    # -- model replies -----------------------------------------------------------------------
    def _convert(self, history: Sequence[AnyMessage], reply: AIMessage) -> AIMessage:
        """``reply`` with its malformed calls turned into calls answered by an error, or,
        once the retries are used up, a final reply that says why the run ends."""
        only_malformed = not reply.tool_calls
        attempt = malformed_in_turn(history) + 1
        bad = [
            {
                "id": c["id"] or f"malformed-{uuid.uuid4().hex[:12]}",
                "name": c["name"],
                "args": (c["args"] or "")[:_RAW_CHARS],
                "error": c["error"],
            }
            for c in reply.invalid_tool_calls
        ]
        names = [b["name"] or "?" for b in bad]
        meta = {**reply.response_metadata, MALFORMED_KEY: bad}
        if only_malformed and attempt > self.config.max_retries:
            self.events.emit(
                "reply_check_failed",
                self.name,
                reason="malformed",
                tools=names,
                error=bad[0]["error"],
                retries=self.config.max_retries,
            )
            text = text_of(reply).strip() or (
                f"Stopping: my tool calls could not be parsed after "
                f"{self.config.max_retries} retries ({bad[0]['error'] or 'invalid arguments'})."
            )
            return reply.model_copy(
                update={"content": text, "invalid_tool_calls": [], "response_metadata": meta}
            )
        self.events.emit(
            "tool_call_malformed",
            self.name,
            tools=names,
            errors=[b["error"] for b in bad],
            attempt=attempt if only_malformed else 0,
        )
        answered: list[ToolCall] = [
            {"name": b["name"] or "unknown_tool", "args": {}, "id": b["id"], "type": "tool_call"}
            for b in bad
        ]
        return reply.model_copy(
            update={
                "tool_calls": [*reply.tool_calls, *answered],
                "invalid_tool_calls": [],
                "response_metadata": meta,
            }
        )

    def _check(
        self, request: ModelRequest[Any], response: ModelResponse[Any], *, nudged: bool
    ) -> ModelResponse[Any] | ModelRequest[Any]:
        """The response to return, or a request to nudge the model with (once)."""
        result = response.result
        reply = result[-1] if result else None
        if not isinstance(reply, AIMessage):
            return response
        problem = problem_of(reply)
        if problem is None:
            return response
        if problem == "malformed":
            fixed = self._convert(request.state["messages"], reply)
            return ModelResponse(
                result=[*result[:-1], fixed], structured_response=response.structured_response
            )
        final = not reply.tool_calls
        meta = reply.response_metadata
        self.events.emit(
            f"reply_{problem}",
            self.name,
            final=final,
            finish_reason=meta.get("finish_reason") or meta.get("stop_reason"),
        )
        if not final:
            return response  # the run goes on with the calls it has
        if self.terminal_tool and self.config.nudge and not nudged:
            self.events.emit("reply_nudged", self.name, reason=problem, tool=self.terminal_tool)
            note = (
                f"Your last reply was empty. Finish now by calling {self.terminal_tool} "
                "with your answer."
                if problem == "empty"
                else f"Your last reply was cut off at the token limit. Call "
                f"{self.terminal_tool} now with a short, complete answer."
            )
            shown = [reply] if problem == "truncated" else []
            return with_note(request.override(messages=[*request.messages, *shown]), [note])
        self.events.emit("reply_check_failed", self.name, reason=problem, nudged=nudged)
        return response

    # -- tool calls --------------------------------------------------------------------------
    def _answer(self, request: ToolCallRequest) -> ToolMessage | None:
        """The error observation for a malformed call, or ``None`` for a normal one."""
        call = request.tool_call
        if call["args"]:
            return None  # the fast path: a converted call has no arguments
        messages = request.state.get("messages", []) if isinstance(request.state, dict) else []
        for m in reversed(messages):
            if isinstance(m, AIMessage):
                for bad in m.response_metadata.get(MALFORMED_KEY, ()):
                    if bad["id"] == call["id"]:
                        return ToolMessage(
                            content=parse_error_text(bad["name"], bad["args"], bad["error"]),
                            tool_call_id=call["id"] or "",
                            name=call["name"],
                            status="error",
                        )
                return None
        return None

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        out = self._check(request, handler(request), nudged=False)
        if isinstance(out, ModelRequest):
            second = self._check(request, handler(out), nudged=True)
            assert isinstance(second, ModelResponse)  # nudged: never another request
            return second
        return out

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        out = self._check(request, await handler(request), nudged=False)
        if isinstance(out, ModelRequest):
            second = self._check(request, await handler(out), nudged=True)
            assert isinstance(second, ModelResponse)  # nudged: never another request
            return second
        return out

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]
    ) -> ToolResult:
        answer = self._answer(request)
        return handler(request) if answer is None else answer

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        answer = self._answer(request)
        return await handler(request) if answer is None else answer
