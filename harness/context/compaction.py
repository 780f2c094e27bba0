"""L2 compaction: rule-based projection of bulky structured (JSON) tool results."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field


class ProjectionRule(BaseModel):
    """Keep only ``fields`` of the objects in every list of a tool's JSON result, and at most
    ``top_n`` of them.

    Example: ``ProjectionRule(tool="item_search", fields=["item_id", "price_cny", "rating",
    "material"], top_n=10)``.
    """

    tool: str
    fields: list[str] = Field(default_factory=list, description="Empty keeps all fields")
    top_n: int | None = Field(None, ge=1)


def _project(value: Any, rule: ProjectionRule, *, in_list: bool = False) -> Any:
    if isinstance(value, list):
        items = value[: rule.top_n] if rule.top_n else value
        return [_project(v, rule, in_list=True) for v in items]
    if isinstance(value, dict):
        if in_list and rule.fields:  # a record of a list: keep the configured fields
            return {k: value[k] for k in rule.fields if k in value}
        return {k: _project(v, rule) for k, v in value.items()}
    return value


def compact(text: str, rule: ProjectionRule) -> str | None:
    """The projected result, or ``None`` when ``text`` is not JSON or nothing shrank."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    out = json.dumps(_project(data, rule), separators=(",", ":"), sort_keys=True)
    return out if len(out) < len(text) else None
