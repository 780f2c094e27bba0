"""Reflectors: turn a bad-case cluster (traces, judge comments, hints) into prompt rules.

- :class:`LLMReflector` asks any LangChain chat model.
- :class:`SimulatedReflector` is a deterministic SIMULATOR for offline demos and tests (like
  the offline policy): it proposes the cluster's own imperative hint as the rule. Its rules
  are evidence about the machinery, never about what a real model would write.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage

from evoharness.evolve.prompting.clusters import BadCaseCluster

__all__ = [
    "REFLECTION_PROMPT",
    "LLMReflector",
    "Reflector",
    "SimulatedReflector",
    "parse_rules",
    "render_cluster",
]

REFLECTION_PROMPT = """You improve the system prompt of a tool-using agent.
Below are failed runs that broke the same rubric item, with the judge's comments and the
agent's tool calls. Write at most {max_rules} short, imperative rules that would have
prevented these failures. Do not restate rules the prompt already has; do not change tool
descriptions or safety constraints. Answer with one rule per line, each starting with "- "."""

_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.*\S)\s*$")


def parse_rules(text: str, *, max_rules: int = 5) -> list[str]:
    """The rules in a reflection reply: bullet or numbered lines (plain lines otherwise);
    code fences, headers and blank lines are skipped."""
    lines = [ln for ln in text.replace("```", "\n").splitlines() if ln.strip()]
    bullets = [m.group(1) for m in (_BULLET.match(ln) for ln in lines) if m]
    rules = bullets or [ln.strip() for ln in lines if not ln.strip().endswith(":")]
    return list(dict.fromkeys(r.strip() for r in rules if len(r.strip()) > 3))[:max_rules]


def render_cluster(cluster: BadCaseCluster, *, max_cases: int = 4) -> str:
    """The evidence of a cluster as text for a reflection model."""
    out = [
        f"Rubric item: {cluster.item} ({cluster.priority}); pattern: {cluster.pattern}; "
        f"{cluster.size} failed runs.",
    ]
    if cluster.hint:
        out.append(f"Known fix: {cluster.hint}")
    for c in cluster.cases[:max_cases]:
        out.append(f"\nRequest: {c.query}")
        out.append("Tool calls: " + (" -> ".join(c.tool_calls) or "(none)"))
        if c.final_answer:
            out.append(f"Final answer: {c.final_answer[:300]}")
        for note in c.comments:
            out.append(f"Judge: {note}")
    return "\n".join(out)


@runtime_checkable
class Reflector(Protocol):
    """Proposes prompt rules from evidence."""

    name: str

    def propose(self, cluster: BadCaseCluster, current: str) -> list[str]:
        """New rules for ``cluster`` given the ``current`` system prompt."""
        ...

    def reflect(self, current: str, records: Sequence[Mapping[str, Any]]) -> list[str]:
        """New rules from a GEPA reflective dataset (``Inputs``/``Generated Outputs``/
        ``Feedback`` records) given the current rules text."""
        ...


class SimulatedReflector:
    """SIMULATED reflector: the cluster's imperative hints become the rules (deterministic).

    Args:
        max_rules: Most rules per proposal.
    """

    name = "simulated-reflector"

    def __init__(self, *, max_rules: int = 2) -> None:
        self.max_rules = max_rules

    def propose(self, cluster: BadCaseCluster, current: str) -> list[str]:
        """The cluster's hint, unless the prompt already says it."""
        return [cluster.hint] if cluster.hint and cluster.hint not in current else []

    def reflect(self, current: str, records: Sequence[Mapping[str, Any]]) -> list[str]:
        """The hints of the items failed most often in ``records`` (ties by text)."""
        counts: dict[str, int] = {}
        for r in records:
            for hint in r.get("hints", []) or []:
                if hint and hint not in current:
                    counts[hint] = counts.get(hint, 0) + 1
        ranked = sorted(counts, key=lambda h: (-counts[h], h))
        return ranked[: self.max_rules]


class LLMReflector:
    """A LangChain chat model writes the rules.

    Args:
        model: Any LangChain chat model.
        max_rules: Most rules per proposal.
    """

    def __init__(self, model: BaseChatModel, *, max_rules: int = 3) -> None:
        self.model = model
        self.max_rules = max_rules
        self.name = f"llm:{getattr(model, 'model_name', None) or type(model).__name__}"

    def _ask(self, body: str) -> list[str]:
        reply = self.model.invoke(
            [
                SystemMessage(REFLECTION_PROMPT.format(max_rules=self.max_rules)),
                HumanMessage(body),
            ]
        )
        return parse_rules(str(reply.content), max_rules=self.max_rules)

    def propose(self, cluster: BadCaseCluster, current: str) -> list[str]:
        """Ask the model over the cluster's evidence and the current prompt."""
        rules = self._ask(f"Current system prompt:\n{current}\n\n{render_cluster(cluster)}")
        return [r for r in rules if r not in current]

    def reflect(self, current: str, records: Sequence[Mapping[str, Any]]) -> list[str]:
        """Ask the model over a GEPA reflective dataset."""
        body = json.dumps(list(records)[:8], indent=1, default=str)
        rules = self._ask(f"Current rules:\n{current or '(none)'}\n\nRuns:\n{body}")
        return [r for r in rules if r not in current]
