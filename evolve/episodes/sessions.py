"""Multi-turn sessions: an episode per turn, and a session view the judge can grade.

Each invocation of an agent is its own trace, so each turn is its own
:class:`~evoharness.evolve.episodes.traces.Episode` carrying that turn's request. :func:`sessions`
groups the turns of each session in order; :meth:`SessionView.episode` flattens a session
into one episode (every request, every tool call, the last answer, all interventions) so
any grader judges the whole conversation with the same rubric machinery
(:func:`~evoharness.evolve.judging.jobs.judge_session`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from pydantic import BaseModel

from evoharness.evolve.episodes.evidence import EpisodeEvidence
from evoharness.evolve.episodes.traces import Episode
from evoharness.harness.tracing import Usage


class SessionView(BaseModel):
    """The turns of one session, oldest first."""

    session_id: str
    turns: list[Episode]

    @property
    def trace_ids(self) -> list[str]:
        """The turns' trace ids, in order."""
        return [t.trace_id for t in self.turns]

    def episode(self) -> Episode:
        """The whole session as one episode (id derived from the session id)."""
        turns = self.turns
        last = turns[-1]
        usage = Usage()
        for t in turns:
            usage.input_tokens += t.usage.input_tokens
            usage.output_tokens += t.usage.output_tokens
            usage.total_tokens += t.usage.total_tokens
            usage.cached_input_tokens += t.usage.cached_input_tokens
        offered = [t.evidence.tools_available for t in turns]
        known = [n for n in offered if n is not None]
        errors = [t for t in turns if t.status == "error"]
        return Episode(
            trace_id=hashlib.sha256(f"session:{self.session_id}".encode()).hexdigest()[:32],
            run_id=f"session:{self.session_id}",
            query="\n".join(f"[turn {i + 1}] {t.query or ''}" for i, t in enumerate(turns)),
            messages=last.messages,
            tool_calls=[c for t in turns for c in t.tool_calls],
            final_answer=last.final_answer,
            usage=usage,
            model_calls=sum(t.model_calls for t in turns),
            status="error" if errors else last.status,
            error=errors[-1].error if errors else None,
            tags=sorted({tag for t in turns for tag in t.tags}),
            user_id=last.user_id,
            session_id=self.session_id,
            skill_ids=sorted({s for t in turns for s in t.skill_ids}),
            start_time=turns[0].start_time,
            end_time=last.end_time,
            metadata={**turns[0].metadata, "turns": len(turns), "trace_ids": self.trace_ids},
            evidence=EpisodeEvidence(
                interventions=[i for t in turns for i in t.evidence.interventions],
                tools_available=max(known) if known else None,
                last_observation_error=last.evidence.last_observation_error,
            ),
        )


def sessions(episodes: Iterable[Episode]) -> list[SessionView]:
    """Group turns by session (an episode without a session is a session of one), each
    session's turns oldest first, sessions by their first turn."""
    groups: dict[str, list[Episode]] = {}
    for e in episodes:
        groups.setdefault(e.session_id or f"trace:{e.trace_id}", []).append(e)
    views = [
        SessionView(session_id=k, turns=sorted(v, key=lambda e: (e.start_time, e.trace_id)))
        for k, v in groups.items()
    ]
    return sorted(views, key=lambda s: (s.turns[0].start_time, s.session_id))
