"""Curation: turn routed cases into memory operations (a model proposes, or rules do)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import ValidationError

from evoharness.evolve._json import extract_json
from evoharness.evolve.episodes.cases import CaseKey, PatternFn, case_of, default_pattern
from evoharness.evolve.episodes.steps import procedure_of, run_steps
from evoharness.evolve.episodes.traces import ToolCallRecord
from evoharness.evolve.memory.reducer import MemoryOp
from evoharness.sdk.memory import MemoryEntry


def tool_sequence(pkg: dict[str, Any]) -> list[str]:
    """The steps of a package's run, in order (:func:`~evoharness.evolve.episodes.steps.
    run_steps`: consecutive calls of one tool are one step, a retry collapses into its
    call, a call that failed alone — a tool that does not exist — is no step)."""
    calls = [ToolCallRecord.model_validate(c) for c in pkg["tool_calls"]]
    return [s.tool for s in run_steps(calls)]


def passes_strategy_gates(
    pkg: dict[str, Any],
    *,
    min_total: float = 0.8,
    min_acts: int = 4,
    min_tools: int = 3,
) -> bool:
    """Score >= 0.8, >= 4 successful tool acts, >= 3 distinct tools."""
    calls = [c for c in pkg["tool_calls"] if not c.get("error")]
    if pkg["verdict"]["total"] < min_total or len(calls) < min_acts:
        return False
    return len({c["name"] for c in calls}) >= min_tools


Packages = Sequence[dict[str, Any]]
"""A cycle's diagnosis packages (one judged episode each: ``trace_id``, ``verdict``, ...)."""


class Proposer(Protocol):
    """Proposes memory operations from this cycle's cases."""

    def propose(
        self, good: Packages, bad: Packages, existing: Sequence[MemoryEntry]
    ) -> list[MemoryOp]: ...


_ID_LIKE = re.compile(r"\d")


def readable_pattern(pattern: str) -> str:
    """``pattern`` when it reads as a name ("apparel", "refund"), else ``""``: a pattern
    holding an internal id (a task id, a number) never reaches text the model reads."""
    return "" if _ID_LIKE.search(pattern) else pattern


def strategy_text(pattern: str, seq: Sequence[str]) -> str:
    """A strategy as an instruction: "For <pattern> requests, call a, then b, then c."
    ("Call a, then b." when the pattern is no readable name, see :func:`readable_pattern`)."""
    steps = ", then ".join(seq)
    name = readable_pattern(pattern)
    return f"For {name} requests, call {steps}." if name else f"Call {steps}."


def named_steps(entry: MemoryEntry) -> list[str]:
    """A strategy's steps in the order its text names them (entries merged by older
    versions kept their tool hints sorted; the text kept the order)."""
    words = re.findall(r"[\w-]+", entry.summary)
    at = {w: i for i, w in reversed(list(enumerate(words)))}
    order = {t: n for n, t in enumerate(entry.tool_hints)}
    return sorted(entry.tool_hints, key=lambda t: (at.get(t, len(words)), order[t]))


class RuleProposer:
    """Deterministic proposer (no model): strategies from gated goodcases, lessons from the
    failed rubric items of badcases (their imperative hint).

    Only goodcases whose success was shown by evidence become strategies; failed and
    undecided runs never do. A case pattern has one strategy: the procedure its supporting
    runs followed (:func:`~evoharness.evolve.episodes.steps.procedure_of`: the most common
    step sequence, which holds every step they all share), recomputed when new good runs
    of the pattern come in — the earlier strategy counts as its supporting runs — and
    replaced when another sequence is now the most common. So a strategy names, in order,
    every step its supporting runs share.

    A lesson is the hint itself ("Call shipping_calc for every pick."), never the item's
    description; one entry per distinct hint, scoped to every case pattern it was learned
    in (``patterns``), and no pattern in its text.

    Args:
        pattern: Maps a query to its pattern (what retrieval matches on).
        hints: Rubric item id -> imperative hint (a ``(description, hint)`` pair is
            accepted for compatibility; the hint is used).
        case_key: Maps (query, trace metadata) to the case key; overrides ``pattern``.
    """

    def __init__(
        self,
        *,
        pattern: PatternFn = default_pattern,
        hints: Mapping[str, str | tuple[str, str]] | None = None,
        case_key: CaseKey | None = None,
    ) -> None:
        self.pattern = pattern
        self.case_key = case_key
        self.hints = {
            k: (v[1] if isinstance(v, tuple) else v) for k, v in (hints or {}).items() if v
        }

    def key(self, pkg: dict[str, Any]) -> str:
        """The case key of a diagnosis package."""
        return case_of(pkg, self.case_key, self.pattern)

    def propose(
        self, good: Packages, bad: Packages, existing: Sequence[MemoryEntry]
    ) -> list[MemoryOp]:
        return [*self.strategies(good, existing), *self.lessons(bad, existing)]

    def strategies(self, good: Packages, existing: Sequence[MemoryEntry]) -> list[MemoryOp]:
        """One strategy per case pattern of the gated goodcases (see the class docstring)."""
        runs: dict[str, list[dict[str, Any]]] = {}
        for pkg in good:
            if pkg["verdict"].get("success") is not True or not passes_strategy_gates(pkg):
                continue  # undecided or failed: never a strategy
            runs.setdefault(self.key(pkg), []).append(pkg)
        ops: list[MemoryOp] = []
        for pattern, pkgs in sorted(runs.items()):
            pkgs = sorted(pkgs, key=lambda p: str(p["trace_id"]))
            earlier = sorted(
                (
                    e
                    for e in existing
                    if e.kind == "strategy" and not e.retired and e.query_pattern == pattern
                ),
                key=lambda e: e.id,
            )
            sequences = [tool_sequence(p) for p in pkgs]
            for e in earlier:  # an earlier strategy stands for the runs it was learned from
                sequences += [named_steps(e)] * max(1, len(e.references))
            steps = [s.tool for s in procedure_of(sequences)]
            totals = [float(p["verdict"]["total"]) for p in pkgs]
            entry = MemoryEntry(
                kind="strategy",
                query_pattern=pattern,
                patterns=[pattern],
                summary=strategy_text(pattern, steps),
                tool_hints=steps,
                score=max(totals),
                confidence=max(totals),
                references=[str(p["trace_id"]) for p in pkgs],
            )
            replaced = [e for e in earlier if e.id != entry.id]
            if replaced:  # another procedure is now the most common: it takes the runs over
                entry = entry.model_copy(
                    update={
                        "references": sorted(
                            {*entry.references, *(r for e in replaced for r in e.references)}
                        )
                    }
                )
            ops.append(MemoryOp(op="ADD", entry=entry, reason=f"{len(pkgs)} goodcase(s)"))
            ops += [
                MemoryOp(op="DELETE", id=e.id, reason=f"replaced by {entry.id}") for e in replaced
            ]
        return ops

    def lessons(self, bad: Packages, existing: Sequence[MemoryEntry]) -> list[MemoryOp]:
        """One lesson per distinct hint of the badcases' failed items, scoped to the
        patterns it failed in; an earlier entry with the same text but its own pattern (as
        older versions wrote one per pattern) is folded into it."""
        found: dict[str, tuple[set[str], set[str], list[str]]] = {}  # hint -> (patterns,
        for pkg in bad:  # traces, items)
            pattern = self.key(pkg)
            for item in pkg["verdict"]["p0_failures"] + pkg["verdict"]["p1_failures"]:
                hint = self.hints.get(item)
                if not hint:
                    continue
                patterns, traces, items = found.setdefault(hint, (set(), set(), []))
                patterns.add(pattern)
                traces.add(str(pkg["trace_id"]))
                if item not in items:
                    items.append(item)
        ops: list[MemoryOp] = []
        for hint, (patterns, traces, items) in sorted(found.items()):
            entry = MemoryEntry(kind="lesson", summary=hint, avoid_hints=[hint])
            older = [
                e
                for e in existing
                if e.kind == "lesson" and not e.retired and e.summary == hint and e.id != entry.id
            ]
            for e in older:
                patterns.update(e.scopes)
                traces.update(e.references)
            entry = entry.model_copy(
                update={
                    "patterns": sorted(patterns),
                    "score": 0.7,
                    "confidence": 0.7,
                    "references": sorted(traces),
                }
            )
            ops.append(MemoryOp(op="ADD", entry=entry, reason=f"badcase failed {', '.join(items)}"))
            ops += [MemoryOp(op="DELETE", id=e.id, reason=f"one entry: {entry.id}") for e in older]
        return ops


CURATOR_PROMPT = """You curate an agent's memory of strategies and lessons. Given new cases
and the existing entries, propose itemised operations as JSON only:
{"ops": [{"op": "ADD", "entry": {"kind": "strategy|lesson", "query_pattern": "...",
"summary": "...", "tool_hints": [], "avoid_hints": [], "score": 0.8, "references": ["<trace id>"]}},
{"op": "UPDATE", "id": "<id>", "changes": {"summary": "..."}},
{"op": "MERGE", "ids": ["<id>", "<id>"]}, {"op": "DELETE", "id": "<id>"}]}.
Never rewrite the whole memory; change only what the cases justify."""


class LLMCurator:
    """A model proposes the operations; unparsable output proposes nothing (recorded)."""

    def __init__(self, model: BaseChatModel, *, fallback: Proposer | None = None) -> None:
        self.model = model
        self.fallback = fallback
        self.failures = 0

    def propose(
        self, good: Packages, bad: Packages, existing: Sequence[MemoryEntry]
    ) -> list[MemoryOp]:
        def brief(pkg: dict[str, Any]) -> dict[str, Any]:
            return {
                "trace_id": pkg["trace_id"],
                "query": pkg.get("query"),
                "tools": tool_sequence(pkg),
                "total": pkg["verdict"]["total"],
                "failed": pkg["verdict"]["p0_failures"] + pkg["verdict"]["p1_failures"],
            }

        payload = {
            "good": [brief(p) for p in good],
            "bad": [brief(p) for p in bad],
            "existing": [
                {"id": e.id, "kind": e.kind, "pattern": e.query_pattern, "summary": e.summary}
                for e in existing
            ],
        }
        reply = self.model.invoke(
            [SystemMessage(CURATOR_PROMPT), HumanMessage(json.dumps(payload))]
        )
        try:
            data = extract_json(str(reply.content))
            return [MemoryOp.model_validate(op) for op in data.get("ops", [])]
        except (ValueError, ValidationError):
            self.failures += 1
            return self.fallback.propose(good, bad, existing) if self.fallback else []
