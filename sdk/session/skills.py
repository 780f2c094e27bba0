"""Skill sets through the session door: the ``active`` set, pinned, offered by case pattern.

Evolve publishes learned skills (and hand-written skill folders can be imported) as
versions of ``skills/<name>``. A session pins the version its label points at when it
starts — or, while a candidate is rolled out to a share of sessions, that candidate,
sticky by user — and is offered, for its whole life, the skills of that version whose case
pattern matches its first request: names and descriptions in the static system prompt,
bodies through ``load_skill``, workflows as tools
(:class:`~evoharness.harness.context.skills.SkillsMiddleware`). The trace records
``skills/<name>`` with the version, and the offered and loaded skills in its metadata.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from langchain.agents.middleware import AgentMiddleware

from evoharness.harness.context.skills import SkillCard, SkillsMiddleware
from evoharness.harness.errors import ConfigError
from evoharness.harness.tracing import Tracer
from evoharness.sdk.registry.base import Registry
from evoharness.sdk.rollout.assignment import bucket
from evoharness.sdk.rollout.controller import RolloutController
from evoharness.sdk.session.door import Resolved, SessionContext, current_pin
from evoharness.sdk.skills.registry import SKILLS, CaseKey, SkillSet, skill_set_of, workflow_of

__all__ = ["PinnedSkillsMiddleware", "SkillsSource"]


class SkillsSource:
    """Resolves the skill set a session is offered skills from.

    Args:
        registry: Where the skill sets live.
        name: The ``skills`` artifact.
        label: The label new sessions follow.
        case_key: ``request -> case pattern`` (e.g. an environment plugin's case key); a
            skill is offered only where its pattern matches. Without one, a pattern matches
            a request that contains all of its words.
        tracer: Records each inner call of a workflow as a child span of the workflow's
            tool span (``create_evo_agent`` passes its own).
        candidate: A label rolled out to a share of sessions (e.g. ``candidate``).
        candidate_share: That share (0-1), sticky by the session's rollout unit (user);
            those sessions record the arm ``candidate``.
        keep: Skill-set versions kept parsed in memory.
        rollout: Consulted first: while a skill-set version is rolled out (any kind is a
            rollout arm), a session gets its arm (sticky by user) and records it.
    """

    kind = SKILLS

    def __init__(
        self,
        registry: Registry,
        name: str = "default",
        *,
        label: str = "active",
        case_key: CaseKey | None = None,
        tracer: Tracer | None = None,
        candidate: str | None = None,
        candidate_share: float = 0.0,
        keep: int = 4,
        rollout: RolloutController | None = None,
    ) -> None:
        if not 0.0 <= candidate_share <= 1.0:
            raise ConfigError("candidate_share must be between 0 and 1", field="candidate_share")
        self.registry = registry
        self.name = name
        self.label = label
        self.case_key = case_key
        self.tracer = tracer
        self.candidate = candidate
        self.candidate_share = candidate_share
        self.keep = keep
        self.rollout = rollout
        self._sets: OrderedDict[int, SkillSet] = OrderedDict()
        self._cards: dict[tuple[int, str], list[SkillCard]] = {}
        self._lock = threading.Lock()

    def skill_set(self, version: int) -> SkillSet:
        """Version ``version`` (read and parsed once; versions are immutable)."""
        with self._lock:
            hit = self._sets.get(version)
            if hit is not None:
                self._sets.move_to_end(version)
                return hit
        got = skill_set_of(self.registry.get(SKILLS, self.name, version))
        with self._lock:
            got = self._sets.setdefault(version, got)
            while len(self._sets) > self.keep:
                old, _ = self._sets.popitem(last=False)
                self._cards = {k: v for k, v in self._cards.items() if k[0] != old}
        return got

    def _arm(
        self, context: SessionContext, labels: dict[str, int]
    ) -> tuple[str | None, int | None]:
        if self.candidate and self.candidate_share > 0 and self.candidate in labels:
            salt = f"{SKILLS}/{self.name}/{self.candidate}@{labels[self.candidate]}"
            if bucket(salt, context.unit) < self.candidate_share:
                return "candidate", labels[self.candidate]
            if self.label in labels:
                return "control", labels[self.label]
        return None, labels.get(self.label)

    def resolve(self, context: SessionContext) -> Resolved:
        """The session's arm of the set's running rollout (sticky by user), else the set
        ``label`` points at (or the shared-out candidate); nothing before the first
        version is published."""
        rolled = (
            self.rollout.arm_for(self.name, context.unit, kind=SKILLS) if self.rollout else None
        )
        experiment = None
        if rolled is not None:
            arm, version, experiment = rolled.arm, rolled.version, rolled.experiment_id
        else:
            arm, version = self._arm(context, self.registry.labels(SKILLS, self.name))
        if version is None:
            return Resolved(SKILLS, self.name, arm=arm, experiment_id=experiment)
        return Resolved(
            SKILLS,
            self.name,
            version=str(version),
            value=self.skill_set(version),
            arm=arm,
            experiment_id=experiment,
        )

    def cards(self, skills: SkillSet, query: str) -> list[SkillCard]:
        """The skills offered for ``query`` from ``skills``, as the harness serves them
        (cached per version and case pattern)."""
        key = (skills.version, self.case_key(query) if self.case_key else query)
        with self._lock:
            hit = self._cards.get(key)
        if hit is not None:
            return hit
        cards = [
            SkillCard(
                name=s.name,
                description=s.description,
                body=s.body,
                workflow=workflow_of(s),
            )
            for s in skills.offered(query, self.case_key)
        ]
        with self._lock:
            if len(self._cards) > 4096:  # patterns are few; free-text keys could be many
                self._cards.clear()
            self._cards[key] = cards
        return cards

    def middleware(self) -> AgentMiddleware[Any, Any, Any]:
        """Offers the pinned set's matching skills (one middleware per agent)."""
        return PinnedSkillsMiddleware(self)


class PinnedSkillsMiddleware(SkillsMiddleware):
    """The harness's progressive disclosure, fed from the session's pinned skill set.

    Without a pin, or before any version is published, it offers nothing.

    Args:
        source: The source whose pinned version it serves.
    """

    def __init__(self, source: SkillsSource) -> None:
        self.source = source
        super().__init__(self._provide, tracer=source.tracer)

    @property
    def name(self) -> str:
        return f"PinnedSkills[{self.source.name}]"

    def _provide(self, query: str, user_id: str | None) -> list[SkillCard]:
        pin = current_pin()
        got = pin.get(SKILLS, self.source.name) if pin is not None else None
        if got is None or not isinstance(got.value, SkillSet):
            return []
        return self.source.cards(got.value, query)
