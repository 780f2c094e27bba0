"""Where a trace and a score come from: offline runs, and the judge behind a score.

Two facts every production reader needs and that the trace schema alone does not say:

**Offline runs.** A run made to measure something — a prompt candidate's search or paired
evaluation, an adapter or skill gate, a benchmark arm — is not app traffic. It is written to
its own store by default (:func:`eval_store_path`: ``traces.db`` -> ``traces.eval.db``) and
always carries :data:`OFFLINE_TAG`, so that a production read (the evolve cycle, the judge,
the report, the monitor, the layer router, rollout statistics) leaves it out even when both
share one file. Readers filter it in SQL (``TraceQuery(without_tags=[OFFLINE_TAG])``).

**Judge identity.** A judge's scores (``total``, ``judge_success``, ``p0_pass``, ...) carry the
environment whose judge wrote them in ``source`` (:func:`judge_source`: ``judge:<env>``) and
in their ids (:func:`judge_score_id`), next to the rubric version (``rubric_version``) and the
judge kind (the comment). Two judges of different environments therefore never overwrite
each other. :func:`resolve_scores` is the one rule by which readers see one judge's scores
under the plain names: the judge they were configured with, else the judge of the
environment the trace is tagged with, else the newest judge of any other environment than
``generic``, else the generic judge, else scores written before judges had an identity
(``source="judge"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from evoharness.harness.tracing.schema import Score

__all__ = [
    "GENERIC_JUDGE",
    "LEGACY_JUDGE_SOURCE",
    "OFFLINE_TAG",
    "ScoreView",
    "eval_store_path",
    "is_offline",
    "judge_of",
    "judge_score_id",
    "judge_source",
    "resolve_scores",
]

OFFLINE_TAG = "evoharness.offline"
"""Tag on every offline run (evaluation, search, gate and benchmark arms): never app traffic."""

GENERIC_JUDGE = "generic"
"""The environment name of the generic judge (no checker: evidence only)."""

LEGACY_JUDGE_SOURCE = "judge"
"""``source`` of judge scores written before scores carried the judge's environment."""

_JUDGE_PREFIX = "judge:"


def is_offline(tags: Iterable[str]) -> bool:
    """Whether a trace with these tags is an offline run (see :data:`OFFLINE_TAG`)."""
    return OFFLINE_TAG in tags


def eval_store_path(db: Path | str) -> Path:
    """The default store for offline runs beside the app's trace store ``db``.

    ``.evoharness/traces.db`` -> ``.evoharness/traces.eval.db`` (a name without a suffix
    gets ``.eval.db`` appended).
    """
    path = Path(db)
    suffix = path.suffix or ".db"
    return path.with_name(f"{path.name.removesuffix(path.suffix)}.eval{suffix}")


def judge_source(environment: str) -> str:
    """The ``source`` of the scores the judge of ``environment`` writes (``judge:<env>``)."""
    return f"{_JUDGE_PREFIX}{environment}"


def judge_of(source: str) -> str | None:
    """The environment of a judge score's ``source``; ``None`` for any other source (and
    for scores written before judges had an identity, ``source="judge"``)."""
    if source.startswith(_JUDGE_PREFIX):
        return source[len(_JUDGE_PREFIX) :] or None
    return None


def judge_score_id(trace_id: str, environment: str, name: str) -> str:
    """The stable id of one judge score: a re-grade by the same environment's judge
    replaces it (locally and in Langfuse, which upserts by id); another environment's judge
    writes its own."""
    return f"{trace_id}-{environment}-{name}"


@dataclass
class ScoreView:
    """A trace's scores as a reader sees them.

    Attributes:
        values: Name -> value: every score that is not a judge's, plus the chosen judge's
            scores under their plain names (``total``, ``judge_success``, ...).
        judges: Environment -> that judge's scores (name -> value), for every judge with an
            identity.
        judge: The environment whose judge's scores ``values`` holds (``None``: none, or
            only scores written before judges had an identity).
    """

    values: dict[str, float | str] = field(default_factory=dict)
    judges: dict[str, dict[str, float | str]] = field(default_factory=dict)
    judge: str | None = None


def _chosen(judges: Mapping[str, float], *, tags: Sequence[str], judge: str | None) -> str | None:
    """Which judge's scores a reader sees (``judges``: environment -> newest score time)."""
    if judge is not None:
        return judge if judge in judges else None
    tagged = [j for j in judges if j in tags]
    if tagged:
        return max(tagged, key=lambda j: (judges[j], j))
    specific = [j for j in judges if j != GENERIC_JUDGE]
    if specific:
        return max(specific, key=lambda j: (judges[j], j))
    return GENERIC_JUDGE if GENERIC_JUDGE in judges else None


def resolve_scores(
    scores: Iterable[Score], *, tags: Sequence[str] = (), judge: str | None = None
) -> ScoreView:
    """The scores of one trace as readers see them (the rule in the module docstring).

    Args:
        scores: The trace's stored scores.
        tags: The trace's tags (a judge of an environment the trace is tagged with wins).
        judge: The environment whose judge the reader is configured with. Its scores are the
            only judge scores under the plain names (legacy scores without an identity fill
            in when it wrote none); another judge's are only in :attr:`ScoreView.judges`.
    """
    values: dict[str, float | str] = {}
    legacy: dict[str, float | str] = {}
    judges: dict[str, dict[str, float | str]] = {}
    newest: dict[str, float] = {}
    for s in scores:
        env = judge_of(s.source)
        if env is not None:
            judges.setdefault(env, {})[s.name] = s.value
            newest[env] = max(newest.get(env, s.created_at), s.created_at)
        elif s.source == LEGACY_JUDGE_SOURCE:
            legacy[s.name] = s.value
            values[s.name] = s.value
        else:
            values[s.name] = s.value
    chosen = _chosen(newest, tags=tags, judge=judge)
    if chosen is not None:
        for name in legacy:  # an identified judge's grade replaces an anonymous one
            values.pop(name, None)
        values.update(judges[chosen])
    return ScoreView(values=values, judges=judges, judge=chosen)
