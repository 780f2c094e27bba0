"""BFCL's function documents as LangChain tools.

BFCL writes parameters in its own JSON-schema dialect (``dict``, ``float``, ``tuple``,
``any``); tools get standard JSON schema (``object``, ``number``, ``array``, no type). Tool
names follow the OpenAI rule (``^[a-zA-Z0-9_-]{1,64}$``) as BFCL's own function-calling
handlers do: dots become underscores, and the grader maps names back
(:func:`original_names`). Every tool returns directly: a single-turn task is one model
turn, graded on the calls it makes, so the run ends once they are made.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def tool_name(name: str) -> str:
    """``name`` as a tool name providers accept (dots and other characters -> ``_``)."""
    return _UNSAFE.sub("_", name)[:64]


def original_names(functions: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Tool name -> BFCL's function name, for the functions of one task."""
    return {tool_name(f["name"]): f["name"] for f in functions}


def json_schema(schema: Any) -> Any:
    """BFCL's parameter schema as standard JSON schema (recursively)."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            if value == "any":
                continue  # any type: leave it open
            out[key] = _TYPES.get(value, value)
        elif key == "optional":
            continue  # BFCL's marker; ``required`` already says it
        else:
            out[key] = json_schema(value)
    return out


def _recorded(**kwargs: Any) -> str:
    return "ok"  # single-turn BFCL grades the calls, not what a function returns


def tools_for(functions: Sequence[dict[str, Any]]) -> list[BaseTool]:
    """One tool per BFCL function (direct return: the call is the answer)."""
    tools: list[BaseTool] = []
    for f in functions:
        params = json_schema(f.get("parameters") or {"type": "dict", "properties": {}})
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        tools.append(
            StructuredTool(
                name=tool_name(f["name"]),
                description=f.get("description", ""),
                args_schema=params,
                func=_recorded,
                return_direct=True,
            )
        )
    return tools
