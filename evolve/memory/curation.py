"""Curation: turn routed cases into memory operations (a model proposes, or rules do)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import ValidationError

from evoharness.evolve._json import extract_json
from evoharness.evolve.episodes.cases import CaseKey, PatternFn, case_of, default_pattern
from evoharness.evolve.memory.reducer import MemoryOp
from evoharness.sdk.memory import MemoryEntry, similarity


def tool_sequence(pkg: dict[str, Any]) -> list[str]:
    """The package's successful tool calls' names in order, consecutive repeats collapsed
    (a failed call, e.g. to a tool that does not exist, is never part of a strategy)."""
    seq: list[str] = []
    for c in pkg["tool_calls"]:
        if c.get("error"):
            continue
        if not seq or seq[-1] != c["name"]:
            seq.append(c["name"])
    return seq


def passes_strategy_gates(
    pkg: dict[str, Any],
    existing: Sequence[MemoryEntry],
    pattern: str,
    *,
    min_total: float = 0.8,
    min_acts: int = 4,
    min_tools: int = 3,
    dup_at: float = 0.8,
) -> bool:
    """Score >= 0.8, >= 4 tool acts, >= 3 distinct tools, not a near-duplicate strategy."""
    calls = [c for c in pkg["tool_calls"] if not c.get("error")]
    if pkg["verdict"]["total"] < min_total or len(calls) < min_acts:
        return False
    if len({c["name"] for c in calls}) < min_tools:
        return False
    summary = " -> ".join(tool_sequence(pkg))
    return not any(
        e.kind == "strategy"
        and e.query_pattern == pattern
        and similarity(e.summary, summary) >= dup_at
        for e in existing
    )


class Proposer(Protocol):
    """Proposes memory operations from this cycle's cases."""

    def propose(
        self,
        good: Sequence[dict[str, Any]],
        bad: Sequence[dict[str, Any]],
        existing: Sequence[MemoryEntry],
    ) -> list[MemoryOp]: ...


def strategy_text(pattern: str, seq: Sequence[str]) -> str:
    """A strategy as an instruction: "For <pattern> requests, call a, then b, then c."."""
    steps = ", then ".join(seq)
    return f"For {pattern} requests, call {steps}." if pattern else f"Call {steps}."


class RuleProposer:
    """Deterministic proposer (no model): strategies from gated goodcases, lessons from the
    failed rubric items of badcases (their imperative hint).

    Only goodcases whose success was shown by evidence become strategies; failed and
    undecided runs never do. A lesson is the hint itself ("Call shipping_calc for every
    pick."), never the item's description.

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
        self,
        good: Sequence[dict[str, Any]],
        bad: Sequence[dict[str, Any]],
        existing: Sequence[MemoryEntry],
    ) -> list[MemoryOp]:
        ops: list[MemoryOp] = []
        added: list[MemoryEntry] = list(existing)
        for pkg in good:
            if pkg["verdict"].get("success") is not True:
                continue  # undecided or failed: never a strategy
            pattern = self.key(pkg)
            if not passes_strategy_gates(pkg, added, pattern):
                continue
            seq = tool_sequence(pkg)
            entry = MemoryEntry(
                kind="strategy",
                query_pattern=pattern,
                summary=strategy_text(pattern, seq),
                tool_hints=seq,
                key_decisions=[
                    f"{len(pkg['tool_calls'])} tool calls, total {pkg['verdict']['total']:.2f}"
                ],
                score=pkg["verdict"]["total"],
                confidence=pkg["verdict"]["total"],
                references=[pkg["trace_id"]],
            )
            added.append(entry)
            ops.append(MemoryOp(op="ADD", entry=entry, reason="goodcase passed the gates"))
        for pkg in bad:
            pattern = self.key(pkg)
            failed = pkg["verdict"]["p0_failures"] + pkg["verdict"]["p1_failures"]
            for item in failed:
                hint = self.hints.get(item)
                if not hint:
                    continue
                ops.append(
                    MemoryOp(
                        op="ADD",
                        reason=f"badcase failed {item}",
                        entry=MemoryEntry(
                            kind="lesson",
                            query_pattern=pattern,
                            summary=hint,
                            avoid_hints=[hint],
                            score=0.7,
                            confidence=0.7,
                            references=[pkg["trace_id"]],
                        ),
                    )
                )
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
        self,
        good: Sequence[dict[str, Any]],
        bad: Sequence[dict[str, Any]],
        existing: Sequence[MemoryEntry],
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
