"""BFCL as an evolve environment plugin (registered like any third-party environment).

``pyproject.toml`` registers :data:`environment` in the ``evoharness.environments``
entry-point group as ``bfcl``; ``--env evoharness.examples.bfcl.plugin:environment`` works
without the entry point. The checker re-grades an episode's recorded tool calls with BFCL's
AST checker; its failures are rubric items whose hints become lessons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from evoharness.evolve import Episode, ItemResult, Rubric, RubricItem, default_pattern
from evoharness.evolve.environment import ScoreEvidence
from evoharness.evolve.judging.judge import RuleCheck
from evoharness.examples.bfcl.checker import grade_calls
from evoharness.examples.bfcl.env import BfclEnvironment
from evoharness.examples.bfcl.tasks import BfclTask

BFCL_ITEMS: tuple[RubricItem, ...] = (
    RubricItem(
        id="task_done",
        priority="P1",
        weight=0.5,
        outcome="decides",
        description="BFCL's AST checker accepts the calls",
        avoid_hint="Make exactly the function calls the request asks for.",
    ),
    RubricItem(
        id="unknown_function",
        priority="P0",
        description="Only offered functions are called",
        outcome="decides",
        avoid_hint="Call only the functions you are given; never invent a function name.",
    ),
    RubricItem(
        id="no_call",
        priority="P1",
        weight=0.5,
        description="The request is answered with a function call",
        avoid_hint="Answer with a function call, not with text or a code block.",
    ),
    RubricItem(
        id="wrong_function",
        priority="P1",
        weight=0.3,
        description="The function that fits the request is called",
        avoid_hint="Pick the function whose description matches the request.",
    ),
    RubricItem(
        id="wrong_count",
        priority="P1",
        weight=0.3,
        description="As many calls as the request needs",
        avoid_hint="Make one call per item the request asks about; several items need "
        "several calls.",
    ),
    RubricItem(
        id="missing_param",
        priority="P1",
        weight=0.3,
        description="Every required parameter is given",
        avoid_hint="Give every required parameter of the function.",
    ),
    RubricItem(
        id="unexpected_param",
        priority="P1",
        weight=0.2,
        description="Only parameters the function defines are given",
        avoid_hint="Use only parameter names the function defines.",
    ),
    RubricItem(
        id="wrong_type",
        priority="P1",
        weight=0.2,
        description="Each value has the type its parameter declares",
        avoid_hint="Give each value in the type its parameter declares (integer, number, "
        "string, array, boolean).",
    ),
    RubricItem(
        id="wrong_value",
        priority="P1",
        weight=0.2,
        description="Values are the ones the request gives",
        avoid_hint="Copy values from the request exactly; leave out optional parameters "
        "the request does not mention.",
    ),
    # a function-calling task ends in calls, not in a text answer
    RubricItem(id="empty_answer", priority="P1", weight=0.0, description="(not used by BFCL)"),
)
_GRADED = [i.id for i in BFCL_ITEMS if i.id not in ("task_done", "empty_answer")]


class BfclRules:
    """Rubric items and the rule check for BFCL episodes (tasks by id, else by request)."""

    def __init__(self, env: BfclEnvironment) -> None:
        self.env = env

    @cached_property
    def by_request(self) -> dict[str, BfclTask]:
        out: dict[str, BfclTask] = {}
        for t in self.env.all_tasks:
            out.setdefault(t.request, t)
        return out

    def task_of(self, episode: Episode) -> BfclTask | None:
        task_id = episode.metadata.get("task_id")
        if isinstance(task_id, str) and task_id in self.env.by_id:
            return self.env.by_id[task_id]
        return self.by_request.get(episode.query or "")

    def check(self, episode: Episode, rubric: Rubric) -> list[ItemResult]:
        """BFCL's grade of the episode's recorded calls, as rubric items."""
        task = self.task_of(episode)
        if task is None:
            return []
        grade = grade_calls(task, [(c.name, c.args) for c in episode.tool_calls])
        failed = set(grade.failures)
        results = [
            ItemResult(
                id="task_done",
                priority="P1",
                passed=grade.valid,
                comment=grade.error_type or "",
            ),
            ItemResult(id="empty_answer", priority="P1", passed=True),
        ]
        results += [
            ItemResult(id=item.id, priority=item.priority, passed=item.id not in failed)
            for item in (rubric.item(i) for i in _GRADED)
            if item is not None
        ]
        return results


class BfclPlugin:
    """Checker (BFCL's AST checker on recorded calls), rubric items, case keys (the
    request's content words, so lessons reach similar requests) and lesson hints;
    ``runtime()`` builds a :class:`BfclEnvironment`."""

    name = "bfcl"
    version = "1"

    @cached_property
    def world(self) -> BfclEnvironment:
        return BfclEnvironment()

    @cached_property
    def rules(self) -> BfclRules:
        return BfclRules(self.world)

    def runtime(self, **options: Any) -> BfclEnvironment:
        return BfclEnvironment(**options)

    def checks(self) -> Sequence[RuleCheck]:
        return [self.rules.check]

    def rubric_items(self, query: str) -> Sequence[RubricItem]:
        return list(BFCL_ITEMS)

    def case_key(self, query: str, metadata: Mapping[str, Any]) -> str:
        return default_pattern(query)

    def lesson_hints(self) -> Mapping[str, str]:
        return {i.id: i.avoid_hint for i in BFCL_ITEMS if i.avoid_hint}

    def score_evidence(self) -> Sequence[ScoreEvidence]:
        return ()  # the checker already decides

    def owns(self, episode: Episode) -> bool:
        return "bfcl" in episode.tags or self.rules.task_of(episode) is not None


environment = BfclPlugin()
"""The registered plugin object."""
