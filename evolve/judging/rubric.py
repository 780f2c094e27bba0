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
from importlib.resources import files
from pathlib import Path
from typing import Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, Field, ValidationError

from evoharness.evolve._json import extract_json
from evoharness.harness.tracing.provenance import GENERIC_JUDGE
from evoharness.sdk.registry.base import content_hash
from evoharness.sdk.sqlite import open_sqlite

Priority = Literal["P0", "P1", "P2"]
RULES_VERSION = "rules-v2"
"""The built-in rule items (bumped when they change, so old verdicts are judged again)."""
RUBRIC_PROMPT = """You write grading rubrics for an AI agent's answer to one user request.
Return JSON only: {"items": [{"id": "...", "priority": "P0|P1|P2", "description": "...",
"weight": 0.1, "avoid_hint": "..."}]}.
P0 = red lines (pass/fail), P1 = process items (deduction weight 0-1), P2 = quality items
(scored 1-5). Keep ids short snake_case. Focus on what is specific to this request."""


ItemOutcome = Literal["none", "decides", "refutes"]
"""What passing or failing an item says about task success (see :attr:`RubricItem.outcome`)."""


class RubricItem(BaseModel):
    """One rubric line.

    Attributes:
        id: Stable snake_case id (also the failure type the rule judge reports).
        priority: P0 red line, P1 deduction, or P2 quality (1-5).
        weight: Deduction for a failed P1 item (share of the P1 budget).
        avoid_hint: What to do instead, in the imperative ("Call shipping_calc for every
            pick."); becomes a lesson when the item fails.
        source: ``rule`` or ``model``.
        outcome: What the item says about task success. ``decides``: passing is evidence
            of success and failing of failure (a checker's items, a recorded task score,
            the judge model's ``task_done``); ``refutes``: failing shows failure, passing
            proves nothing (generic signals such as a run that did nothing); ``none``:
            process or quality only.
    """

    id: str
    priority: Priority
    description: str
    weight: float = Field(0.1, ge=0.0, le=1.0)
    avoid_hint: str = ""
    source: Literal["rule", "model"] = "rule"
    outcome: ItemOutcome = "none"


class ItemResult(BaseModel):
    """The judgement of one rubric item: ``passed`` (P0/P1) or ``score`` (P2, 1-5).

    ``passed=None`` (or no result at all) means undecided: the judge had no evidence.
    """

    id: str
    priority: str
    passed: bool | None = None
    score: float | None = Field(None, ge=1.0, le=5.0)
    comment: str = ""


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


_TABLE = json.loads(files(__package__).joinpath("data/rubric_items.json").read_text())
"""The rule rubric's item table (data, so that ids, weights, descriptions and hints are read
and reviewed as a table), read once."""


def _items(part: str) -> tuple[RubricItem, ...]:
    """One part of :data:`_TABLE`."""
    return tuple(RubricItem.model_validate(row) for row in _TABLE[part])


# Generic signals: judged from the trace alone (no checker, no model). Failing any
# ``refutes`` item means the run did not succeed; passing them proves nothing. Repeated
# failures and rejected calls only deduct: a run can recover from them.
SIGNAL_ITEMS: tuple[RubricItem, ...] = _items("signals")

# Every query gets these.
BASE_ITEMS: tuple[RubricItem, ...] = (*_items("base_before"), *SIGNAL_ITEMS, *_items("base_after"))


def query_hash(query: str) -> str:
    """Stable hash of a normalised query."""
    return hashlib.sha256(" ".join(query.lower().split()).encode()).hexdigest()[:16]


class RubricGenerator:
    """Builds rubrics: rules always, a model when configured (cached per query).

    Args:
        model: Proposes query-specific items; ``None`` = rules only.
        extra_items: Environment rules, e.g. from the shop checker (``callable(query)``).
        cache_path: SQLite cache of model-generated items by (query hash, prompt version).
        prompt: The rubric prompt (default :data:`RUBRIC_PROMPT`; the registry's
            ``rubric_prompt/default`` artifact through :mod:`evoharness.evolve.prompts`).
        prompt_version: Version of the rubric prompt (part of :attr:`version`; default:
            ``rubric_prompt/default#<content hash>``).
        env_version: The environment's rubric version (part of :attr:`version`, so a new
            environment version re-grades what the old one judged).
        environment: The environment whose judge these rubrics serve: the identity its
            scores carry (``source="judge:<environment>"``; default ``generic``).
    """

    def __init__(
        self,
        *,
        model: BaseChatModel | None = None,
        extra_items: Callable[[str], Sequence[RubricItem]] | None = None,
        cache_path: Path | None = None,
        prompt: str | None = None,
        prompt_version: str | None = None,
        env_version: str = "",
        environment: str = GENERIC_JUDGE,
    ) -> None:
        self.model = model
        self.env_version = env_version
        self.environment = environment
        self.extra_items = extra_items
        self.prompt = prompt or RUBRIC_PROMPT
        self.prompt_version = (
            prompt_version
            or f"rubric_prompt/default#{content_hash(self.prompt).split(':')[-1][:12]}"
        )
        self._db: sqlite3.Connection | None = None
        if cache_path is not None:
            self._db = open_sqlite(cache_path, wal=False)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS rubric_cache (qh TEXT, version TEXT, "
                "items TEXT, PRIMARY KEY (qh, version))"
            )
        self._memo: dict[str, list[RubricItem]] = {}
        self.model_failures = 0

    def close(self) -> None:
        """Close the cache database (if any); the in-memory memo keeps working."""
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> RubricGenerator:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

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
        reply = self.model.invoke([SystemMessage(self.prompt), HumanMessage(query)])
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
        return Rubric(query_hash=query_hash(query), version=self.version, items=items)

    @property
    def version(self) -> str:
        """What the rubrics depend on: the rules, the prompt (with a model), the environment."""
        parts = [RULES_VERSION]
        if self.model is not None:
            parts.append(self.prompt_version)
        if self.env_version:
            parts.append(self.env_version)
        return "+".join(parts)
