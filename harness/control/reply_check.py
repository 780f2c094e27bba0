"""Reply check (post_reflect): replies that would end a run silently.

* A tool call whose arguments did not parse lands in ``invalid_tool_calls``; a reply with
  only such calls looks like a final answer (usually an empty one), so the run ends as if
  it succeeded and the model is never told. The check turns each malformed call into a
  call that gets an error observation naming the parse problem, as LangChain does for
  arguments that fail validation, so the model can send it again (at most ``max_retries``
  times per user turn; then the run ends with a reply that says why). This also keeps the
  history valid for providers, which reject an assistant tool call without a result.
* A reply whose text is only a tool call written as JSON (``{"name": ..., "arguments":
  ...}``, one or several, bare or in a code fence) naming a bound tool, instead of the
  model's own tool-call syntax, becomes that tool call (``unwrap_calls``). Small
  instruction-tuned models do this often (Qwen2.5-Coder-0.5B answers BFCL zero-shot with
  bare or fenced JSON); without it the run ends as a prose answer that did nothing. Text
  that names no bound tool, or holds anything besides the JSON, is left as it is.
* An empty reply, or one cut off at the token limit (``finish_reason == "length"``,
  ``stop_reason == "max_tokens"``), is recorded; when a terminal tool is configured the
  model is nudged once, in the same model call, to finish with it.

What was done is recorded as events (``tool_call_unwrapped``, ``tool_call_malformed``,
``reply_empty``, ``reply_truncated``, ``reply_nudged``; ``reply_check_failed`` when the run
ends on such a reply, which trace exports show at warning level). The raw malformed calls
are kept on the reply (``response_metadata["evoharness_malformed"]``), so the decision is
read off the history: nothing is kept in the middleware, and a resumed checkpoint behaves the same.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Literal

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from pydantic import ConfigDict, Field

from evoharness.harness._messages import ToolResult, current_turn, text_of, with_note
from evoharness.harness._options import StrictOptions
from evoharness.harness._steps import ModelCall, ModelCallSteps
from evoharness.harness.events import EventLog

MALFORMED_KEY = "evoharness_malformed"
"""Where a converted reply keeps its malformed calls (``response_metadata``)."""

Problem = Literal["malformed", "empty", "truncated"]
_RAW_CHARS = 300


class ReplyCheckConfig(StrictOptions):
    """Options of :class:`ReplyCheckMiddleware`.

    Attributes:
        max_retries: Replies with only malformed tool calls answered with an error
            observation per user turn; the next one ends the run with a reply that says
            why. Malformed calls beside valid ones are always answered (the run goes on
            anyway).
        nudge: Ask once for the terminal tool after an empty or cut-off final reply
            (only when a terminal tool is configured).
        unwrap_calls: Turn a reply that is only JSON tool calls naming bound tools (bare
            or fenced) into those calls.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_retries: int = Field(2, ge=0)
    nudge: bool = True
    unwrap_calls: bool = True


_FENCE = re.compile(r"```[A-Za-z_]*[ \t]*\n?(.*?)```", re.DOTALL)


def _json_values(body: str) -> list[Any] | None:
    """The JSON values ``body`` consists of (whitespace between them), else ``None``."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    i, n = 0, len(body)
    while True:
        while i < n and body[i].isspace():
            i += 1
        if i == n:
            return values or None
        try:
            value, i = decoder.raw_decode(body, i)
        except ValueError:
            return None
        values.append(value)


def unwrapped_calls(text: str, tools: Collection[str]) -> list[ToolCall]:
    """The tool calls ``text`` writes as JSON, when that is all it holds.

    Accepted: one or more ``{"name": <bound tool>, "arguments": {...}}`` objects (or a
    list of them; ``parameters`` for ``arguments``, a JSON-encoded string of an object
    too), bare or each in a code fence, nothing else beside them. Anything else (prose,
    a name that is not bound, arguments that are not an object) gives ``[]``.

    Example:
        >>> reply = '```json\\n{"name": "f", "arguments": {"x": 1}}\\n```'
        >>> [(c["name"], c["args"]) for c in unwrapped_calls(reply, {"f"})]
        [('f', {'x': 1})]
    """
    stripped = text.strip()
    if not stripped or not tools:
        return []
    fences = list(_FENCE.finditer(stripped))
    if fences and _FENCE.sub("", stripped).strip():
        return []  # prose around the fences: an explanation, not a call
    bodies = [m.group(1) for m in fences] or [stripped]
    calls: list[ToolCall] = []
    for body in bodies:
        values = _json_values(body)
        if values is None:
            return []
        items = [v for value in values for v in (value if isinstance(value, list) else [value])]
        for item in items:
            if not isinstance(item, dict) or item.get("name") not in tools:
                return []
            args = item.get("arguments", item.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    return []
            if not isinstance(args, dict):
                return []
            calls.append(
                ToolCall(
                    name=item["name"],
                    args=args,
                    id=f"call_{uuid.uuid4().hex[:12]}",
                    type="tool_call",
                )
            )
    return calls


def bound_tool_names(tools: Sequence[Any]) -> set[str]:
    """Names of the tools bound to a model request (``BaseTool`` or OpenAI dicts)."""
    names: set[str] = set()
    for tool in tools:
        if isinstance(tool, dict):
            name = tool.get("name") or (tool.get("function") or {}).get("name")
        else:
            name = getattr(tool, "name", None)
        if isinstance(name, str):
            names.add(name)
    return names


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


class ReplyCheckMiddleware(ModelCallSteps, AgentMiddleware[Any, Any, Any]):
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
        if self.config.unwrap_calls and not reply.tool_calls and not reply.invalid_tool_calls:
            calls = unwrapped_calls(text_of(reply), bound_tool_names(request.tools))
            if calls:
                self.events.emit("tool_call_unwrapped", self.name, tools=[c["name"] for c in calls])
                reply = reply.model_copy(update={"content": "", "tool_calls": calls})
                result = [*result[:-1], reply]
                response = ModelResponse(
                    result=result, structured_response=response.structured_response
                )
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

    def _model_call(self, request: ModelRequest[Any]) -> ModelCall:
        """The model call as steps: the request, and once more with a nudge when the
        reply needs one. Run by the
        sync and async wrap hooks of :class:`~evoharness.harness._steps.ModelCallSteps`."""
        out = self._check(request, (yield request), nudged=False)
        if isinstance(out, ModelRequest):
            second = self._check(request, (yield out), nudged=True)
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
