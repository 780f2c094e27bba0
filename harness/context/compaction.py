"""L2 compaction: rule-based projection of bulky structured (JSON) tool results."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from evoharness.harness._options import StrictOptions


class ProjectionRule(StrictOptions):
    """Keep only ``fields`` of the objects in every list of a tool's JSON result, and at most
    ``top_n`` of them.

    With ``format="table"`` the projected result is written as text in which every list of
    records becomes a header line naming its columns once and one ``a | b | c`` line per
    record: the same values as the JSON, in about two thirds of the tokens (JSON repeats
    every key in every record).

    Example: ``ProjectionRule(tool="item_search", fields=["item_id", "price_cny", "rating",
    "material"], top_n=10, format="table")``.
    """

    tool: str
    fields: list[str] = Field(default_factory=list, description="Empty keeps all fields")
    top_n: int | None = Field(None, ge=1)
    format: Literal["json", "table"] = Field("json", description="How the result is written")


def _project(value: Any, rule: ProjectionRule, *, in_list: bool = False) -> Any:
    if isinstance(value, list):
        items = value[: rule.top_n] if rule.top_n else value
        return [_project(v, rule, in_list=True) for v in items]
    if isinstance(value, dict):
        if in_list and rule.fields:  # a record of a list: keep the configured fields
            return {k: value[k] for k in rule.fields if k in value}
        return {k: _project(v, rule) for k, v in value.items()}
    return value


def _cell(value: Any) -> str:
    if isinstance(value, str) and "|" not in value and "\n" not in value and value.strip():
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _table(name: str, value: Any, indent: str = "") -> list[str]:
    """Lines for ``name: value``; lists of flat records become a header and rows."""
    records = isinstance(value, list) and value and all(isinstance(v, dict) for v in value)
    if records:
        columns = list(dict.fromkeys(k for v in value for k in v))
        flat = all(not isinstance(v.get(c), dict | list) for v in value for c in columns)
        if flat:
            lines = [f"{indent}{name} ({len(value)} records; {' | '.join(columns)}):"]
            lines += [indent + " | ".join(_cell(v.get(c, "")) for c in columns) for v in value]
            return lines
    if isinstance(value, dict) and value:
        lines = [f"{indent}{name}:"] if name else []
        for k in sorted(value):
            lines += _table(k, value[k], indent + ("  " if name else ""))
        return lines
    return [f"{indent}{name}: {_cell(value)}" if name else _cell(value)]


def compact(text: str, rule: ProjectionRule) -> str | None:
    """The projected result, or ``None`` when ``text`` is not JSON or nothing shrank."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    projected = _project(data, rule)
    if rule.format == "table":
        out = "\n".join(_table("", projected))
    else:
        out = json.dumps(projected, separators=(",", ":"), sort_keys=True)
    return out if len(out) < len(text) else None
