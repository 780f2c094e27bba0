"""Bad-case clusters: the failures one prompt edit could address, grouped with their evidence.

A cluster is a rubric item (P1 process or P2 quality; P0s go to guard rules) failed by
several cases of the same pattern (the environment's case key). It carries what a
reflection model needs: the imperative hint of the item, the judge's comments, and a few
traces (request, tool calls, final answer).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from evoharness.evolve.episodes.cases import CaseKey
from evoharness.evolve.judging.judge import P2_FAIL_BELOW, failed_items

__all__ = ["BadCase", "BadCaseCluster", "cluster_bad_cases", "failed_items"]


class BadCase(BaseModel):
    """One failed case, reduced to what reflection reads."""

    trace_id: str
    query: str
    task_id: str | None = None
    tool_calls: list[str] = Field(default_factory=list)
    """``name(args)`` of each call, in order (``!`` marks a failed call)."""
    final_answer: str = ""
    comments: list[str] = Field(default_factory=list)


class BadCaseCluster(BaseModel):
    """Cases failing the same rubric item in the same case pattern.

    Attributes:
        item: The rubric item id.
        priority: ``P1`` or ``P2``.
        pattern: The case pattern (the environment's case key).
        hint: The item's imperative hint (what to do instead), if the environment has one.
        cases: The failing cases, by task id.
    """

    item: str
    priority: str
    pattern: str
    hint: str = ""
    cases: list[BadCase] = Field(default_factory=list)

    @property
    def key(self) -> str:
        """``item/pattern``: a stable id for reports and the registry."""
        return f"{self.item}/{self.pattern}"

    @property
    def size(self) -> int:
        """How many cases failed."""
        return len(self.cases)

    @property
    def task_ids(self) -> list[str]:
        """Task ids of the cases (those that recorded one), without repeats."""
        return list(dict.fromkeys(c.task_id for c in self.cases if c.task_id))


def _call_text(call: Mapping[str, Any]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in sorted(dict(call.get("args") or {}).items()))
    mark = "!" if call.get("error") else ""
    return f"{mark}{call.get('name')}({args})"[:240]


def cluster_bad_cases(
    packages: Iterable[Mapping[str, Any]],
    *,
    case_key: CaseKey | None = None,
    hints: Mapping[str, str] | None = None,
    priorities: Sequence[str] = ("P1", "P2"),
    min_size: int = 2,
    p2_below: float = P2_FAIL_BELOW,
) -> list[BadCaseCluster]:
    """Group diagnosis packages (evolve's routed cases) by failed rubric item and pattern.

    Args:
        packages: Diagnosis packages, e.g. ``EvolveState.pool("lesson_candidate", ...)``.
        case_key: The environment's case key (``EvolveEnvironment.case_key``); default: one
            pattern for everything.
        hints: Item id -> imperative hint (``lesson_hints_of(env)``).
        priorities: Which priorities to cluster (P0s are the guard-rule layer's).
        min_size: Smallest cluster returned; an item's pattern groups smaller than this
            are pooled into one cluster of that item with pattern ``*``.
        p2_below: A P2 item scored below this counts as failed (default: the cut layer
            routing and the router's preference pool use, on the 1-5 scale).

    Returns:
        Clusters, largest first (ties by key).
    """
    hints = hints or {}
    groups: dict[tuple[str, str], BadCaseCluster] = {}

    def order(pkg: Mapping[str, Any]) -> tuple[str, str, str]:
        task = (pkg.get("metadata") or {}).get("task_id")
        return (str(task or ""), str(pkg.get("query") or ""), str(pkg.get("trace_id")))

    # a deterministic order (pools are ordered by write time): same packages, same clusters
    for pkg in sorted(packages, key=order):
        verdict = pkg.get("verdict") or {}
        query = str(pkg.get("query") or "")
        meta = dict(pkg.get("metadata") or {})
        pattern = case_key(query, meta) if case_key is not None else "all"
        comments = {
            str(it.get("id")): str(it.get("comment") or "") for it in verdict.get("items", [])
        }
        for item, priority in failed_items(verdict, p2_below=p2_below):
            if priority not in priorities:
                continue
            cluster = groups.setdefault(
                (item, pattern),
                BadCaseCluster(
                    item=item, priority=priority, pattern=pattern, hint=hints.get(item, "")
                ),
            )
            notes = [c for c in (comments.get(item, ""), *verdict.get("comments", [])) if c]
            cluster.cases.append(
                BadCase(
                    trace_id=str(pkg.get("trace_id")),
                    query=query,
                    task_id=str(meta["task_id"]) if meta.get("task_id") is not None else None,
                    tool_calls=[_call_text(c) for c in pkg.get("tool_calls") or []],
                    final_answer=str(pkg.get("final_answer") or "")[:500],
                    comments=list(dict.fromkeys(notes))[:5],
                )
            )
    out = [c for c in groups.values() if c.size >= min_size]
    # pattern groups too small on their own are pooled per item (pattern "*")
    pooled: dict[str, BadCaseCluster] = {}
    for c in groups.values():
        if c.size < min_size:
            p = pooled.setdefault(
                c.item, BadCaseCluster(item=c.item, priority=c.priority, pattern="*", hint=c.hint)
            )
            p.cases.extend(c.cases)
    out += [c for c in pooled.values() if c.size >= min_size]
    return sorted(out, key=lambda c: (-c.size, c.key))
