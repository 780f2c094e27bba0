"""The layered session state context engineering keeps (checkpointed with the thread)."""

from __future__ import annotations

from typing import Annotated, Any, NotRequired, TypedDict

from langchain.agents.middleware import AgentState


def merge_dicts(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    """Reducer: shallow merge, right wins (``None`` values delete keys)."""
    out = dict(left or {})
    for k, v in (right or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


class TaskState(TypedDict, total=False):
    goal: str
    constraints: dict[str, str]
    """slot -> the user's own words (verbatim), the latest statement per slot."""
    restated: list[str]
    """Slots the user changed after first stating them."""


class WorkingMemory(TypedDict, total=False):
    stable_history_summary: str
    restated: list[str]
    """Constraint slots the user restated, as of the last summary (shown in TASK STATE)."""
    decisions: list[str]
    preferences: list[str]


class ContextState(AgentState[Any]):
    """State extension for context engineering (all merged by reducers)."""

    task_state: NotRequired[Annotated[TaskState, merge_dicts]]
    hot_context: NotRequired[Annotated[dict[str, Any], merge_dicts]]
    working_memory: NotRequired[Annotated[WorkingMemory, merge_dicts]]
    cold_data: NotRequired[Annotated[dict[str, Any], merge_dicts]]
    compression_stats: NotRequired[Annotated[dict[str, Any], merge_dicts]]
