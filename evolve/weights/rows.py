"""Training rows built from episodes: chat messages, SFT rows, DPO pairs, GRPO tasks.

Episodes store messages in the trace form (``role`` = ``system``/``human``/``ai``/``tool``,
``tool_calls`` with ``name``/``args``/``id``). Chat templates (and TRL) expect the OpenAI-style
form (``user``/``assistant``, ``tool_calls[].function.{name, arguments}``); :func:`chat_messages`
converts one into the other.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

_ROLES = {"system": "system", "human": "user", "user": "user", "ai": "assistant",
          "assistant": "assistant", "tool": "tool"}  # fmt: skip


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        parts = [
            b.get("text", "") if isinstance(b, dict) else str(b)
            for b in content
            if not isinstance(b, dict) or b.get("type", "text") == "text"
        ]
        return "".join(parts)
    return "" if content is None else str(content)


def chat_message(record: dict[str, Any]) -> dict[str, Any] | None:
    """One trace message record as a chat-template message (``None`` for unknown roles)."""
    role = _ROLES.get(str(record.get("role", "")))
    if role is None:
        return None
    out: dict[str, Any] = {"role": role, "content": _text(record.get("content"))}
    if role == "assistant" and record.get("tool_calls"):
        out["tool_calls"] = [
            {
                "type": "function",
                "id": c.get("id"),
                "function": {"name": c["name"], "arguments": dict(c.get("args") or {})},
            }
            for c in record["tool_calls"]
        ]
    if role == "tool":
        out["name"] = record.get("name")
        out["tool_call_id"] = record.get("tool_call_id")
    return out


def chat_messages(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trace message records as chat-template messages (unknown roles dropped)."""
    return [m for m in (chat_message(r) for r in records) if m is not None]


class SFTRow(BaseModel):
    """One supervised row: a whole conversation (``messages``) and the tool schemas it saw.

    Attributes:
        messages: Chat-template messages; the assistant turns are what is trained.
        tools: OpenAI-style tool schemas (``{"type": "function", "function": {...}}``).
        task: The task key rows are split by (never split one task across splits).
        trace_id: The episode the row came from (provenance).
        prompt_token_ids: The token ids the server returned for the last call, when the trace
            carried them (train on those instead of re-tokenising).
        completion_token_ids: Likewise for the completion.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    task: str
    trace_id: str
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None

    def trl(self) -> dict[str, Any]:
        """The row as TRL's conversational SFT format."""
        return {"messages": self.messages, "tools": self.tools}


class DPORow(BaseModel):
    """One preference pair at the first point where a good and a bad run diverged.

    ``prompt`` is the shared history; ``chosen``/``rejected`` are the next assistant turn of
    the good and of the bad run.
    """

    prompt: list[dict[str, Any]]
    chosen: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    task: str
    chosen_trace_id: str
    rejected_trace_id: str

    def trl(self) -> dict[str, Any]:
        """The row as TRL's conversational preference format."""
        return {
            "prompt": self.prompt,
            "chosen": self.chosen,
            "rejected": self.rejected,
            "tools": self.tools,
        }


class GRPOTask(BaseModel):
    """One task of a replayable environment; the reward comes from its checker (or a judge).

    Attributes:
        prompt: The opening messages (system + user).
        task: The environment's task id (the environment factory resets to it).
        split: The environment split it came from.
    """

    prompt: list[dict[str, Any]]
    task: str
    split: str

    def trl(self) -> dict[str, Any]:
        """The row as a GRPO prompt row (``task_id`` is passed on to rewards/environments)."""
        return {"prompt": self.prompt, "task_id": self.task}
