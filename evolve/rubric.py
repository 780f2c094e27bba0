"""Dynamic rubrics: P0 red lines, P1 process deductions, P2 quality criteria.

A rubric is built per query: a model proposes query-specific items (cached by query hash and
prompt version), and deterministic rules add the items every query gets (no leaked secrets
or internal ids, no fabricated items, ...). Without a model the rules alone make the rubric.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field, ValidationError

from evoharness.evolve._json import extract_json

Priority = Literal["P0", "P1", "P2"]
RUBRIC_PROMPT_VERSION = "rubric-v1"
RUBRIC_PROMPT = """You write grading rubrics for an AI agent's answer to one user request.
Return JSON only: {"items": [{"id": "...", "priority": "P0|P1|P2", "description": "...",
"weight": 0.1, "avoid_hint": "..."}]}.
P0 = red lines (pass/fail), P1 = process items (deduction weight 0-1), P2 = quality items
(scored 1-5). Keep ids short snake_case. Focus on what is specific to this request."""


class RubricItem(BaseModel):
    """One rubric line.

    Attributes:
        id: Stable snake_case id (also the failure type the rule judge reports).
        priority: P0 red line, P1 deduction, or P2 quality (1-5).
        weight: Deduction for a failed P1 item (share of the P1 budget).
        avoid_hint: How to avoid failing it; becomes a lesson when it fails.
        source: ``rule`` or ``model``.
    """

    id: str
    priority: Priority
    description: str
    weight: float = Field(0.1, ge=0.0, le=1.0)
    avoid_hint: str = ""
    source: Literal["rule", "model"] = "rule"


class Rubric(BaseModel):
    """The rubric for one query."""

    query_hash: str
    version: str
    items: list[RubricItem]

    def by_priority(self, priority: Priority) -> list[RubricItem]:
        """Items of one priority."""
        return [i for i in self.items if i.priority == priority]

    def item(self, item_id: str) -> RubricItem | None:
        """An item by id."""
        return next((i for i in self.items if i.id == item_id), None)


# Every query gets these.
BASE_ITEMS: tuple[RubricItem, ...] = (
    RubricItem(
        id="leaked_secret",
        priority="P0",
        description="The answer contains no API keys, tokens or credentials",
        avoid_hint="never repeat keys, tokens or credentials in answers",
    ),
    RubricItem(
        id="fabricated_item",
        priority="P0",
        description="Every recommended item and price comes from a tool result",
        avoid_hint="only recommend items returned by the tools",
    ),
    RubricItem(
        id="run_error",
        priority="P1",
        weight=0.3,
        description="The run finished without crashing",
        avoid_hint="handle tool failures by switching tools instead of retrying",
    ),
    RubricItem(
        id="repeated_call",
        priority="P1",
        weight=0.2,
        description="No tool is called repeatedly with the same arguments",
        avoid_hint="do not retry a failing call with the same arguments",
    ),
    RubricItem(
        id="empty_answer",
        priority="P1",
        weight=0.3,
        description="The run ends with a non-empty final answer",
        avoid_hint="always finish with a clear final answer",
    ),
    RubricItem(id="fit", priority="P2", description="The answer fits the user's request"),
    RubricItem(id="reasons", priority="P2", description="Choices are explained with reasons"),
)


def query_hash(query: str) -> str:
    """Stable hash of a normalised query."""
    return hashlib.sha256(" ".join(query.lower().split()).encode()).hexdigest()[:16]


class RubricGenerator:
    """Builds rubrics: rules always, a model when configured (cached per query).

    Args:
        model: Proposes query-specific items; ``None`` = rules only.
        extra_items: Environment rules, e.g. from the shop checker (``callable(query)``).
        cache_path: SQLite cache of model-generated items by (query hash, prompt version).
    """

    def __init__(
        self,
        *,
        model: BaseChatModel | None = None,
        extra_items: Callable[[str], Sequence[RubricItem]] | None = None,
        cache_path: Path | None = None,
        prompt_version: str = RUBRIC_PROMPT_VERSION,
    ) -> None:
        self.model = model
        self.extra_items = extra_items
        self.prompt_version = prompt_version
        self._db: sqlite3.Connection | None = None
        if cache_path is not None:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(cache_path, check_same_thread=False, isolation_level=None)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS rubric_cache (qh TEXT, version TEXT, "
                "items TEXT, PRIMARY KEY (qh, version))"
            )
        self._memo: dict[str, list[RubricItem]] = {}
        self.model_failures = 0

    def _cached(self, qh: str) -> list[RubricItem] | None:
        if qh in self._memo:
            return self._memo[qh]
        if self._db is not None:
            row = self._db.execute(
                "SELECT items FROM rubric_cache WHERE qh=? AND version=?", (qh, self.prompt_version)
            ).fetchone()
            if row:
                return [RubricItem.model_validate(i) for i in json.loads(row[0])]
        return None

    def _store(self, qh: str, items: list[RubricItem]) -> None:
        self._memo[qh] = items
        if self._db is not None:
            self._db.execute(
                "INSERT OR REPLACE INTO rubric_cache VALUES (?,?,?)",
                (qh, self.prompt_version, json.dumps([i.model_dump() for i in items])),
            )

    def _from_model(self, query: str) -> list[RubricItem]:
        if self.model is None:
            return []
        qh = query_hash(query)
        cached = self._cached(qh)
        if cached is not None:
            return cached
        reply = self.model.invoke([SystemMessage(RUBRIC_PROMPT), HumanMessage(query)])
        try:
            data = extract_json(str(reply.content))
            items = [
                RubricItem.model_validate({**i, "source": "model"}) for i in data.get("items", [])
            ]
        except (ValueError, ValidationError, AttributeError):
            self.model_failures += 1  # rules alone still grade the run
            return []
        self._store(qh, items)
        return items

    def rubric(self, query: str) -> Rubric:
        """The rubric for ``query`` (rules first; model items never replace rule items)."""
        by_id = {i.id: i for i in BASE_ITEMS}
        if self.extra_items is not None:  # environment rules refine the base items
            by_id.update({i.id: i for i in self.extra_items(query)})
        for i in self._from_model(query):
            by_id.setdefault(i.id, i)  # model items never replace rule items
        items = list(by_id.values())
        version = self.prompt_version if self.model is not None else "rules-v1"
        return Rubric(query_hash=query_hash(query), version=version, items=items)
