"""Environment plugins as evolve sees them: checker, rubric items, case keys, lesson hints.

An application (or an example such as the shop) describes itself to evolve with an
:class:`EvolveEnvironment`: an optional checker over an :class:`~evoharness.evolve.episodes.traces.
Episode`, rubric items, the key that groups cases, imperative lesson hints, and a mapping
from scores the app recorded on its traces (user feedback, task success) to evidence. The
run side (tasks and splits, tools, offline model) is the SDK's
:class:`~evoharness.sdk.environment.Environment`, reached through :meth:`~EvolveEnvironment.
runtime`; a plugin without one can still be judged and learned from.

Plugins load from ``package.module:Object`` or by a name registered in the
``evoharness.environments`` entry-point group (:func:`load_plugin`). Evolve never imports
an environment package directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast, runtime_checkable

from pydantic import BaseModel

from evoharness.evolve.episodes.cases import CaseKey, default_case_key
from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.judge import (
    DEFAULT_CHECKS,
    GenericSignals,
    Judge,
    LLMJudge,
    RuleCheck,
    RuleJudge,
)
from evoharness.evolve.judging.rubric import (
    BASE_ITEMS,
    ItemResult,
    Rubric,
    RubricGenerator,
    RubricItem,
)
from evoharness.evolve.memory.curation import RuleProposer
from evoharness.harness import ConfigError
from evoharness.sdk.environment import Environment, call_plugin, resolve_plugin

__all__ = [
    "GENERIC",
    "EnvironmentPlugin",
    "EvolveEnvironment",
    "ScoreEvidence",
    "build_judge",
    "build_proposer",
    "build_rubrics",
    "default_case_key",
    "lesson_hints_of",
    "load_plugin",
    "runtime_of",
    "score_check",
]


class ScoreEvidence(BaseModel):
    """How a score the app recorded on a trace becomes evidence for one rubric item.

    Example: ``ScoreEvidence(score="user_feedback", passed_at=1.0, failed_below=0.5)``
    turns a thumbs-up (1.0) into a pass of ``task_done`` and a thumbs-down (0.0) into a
    failure; values in between, and traces without the score, stay undecided.

    Attributes:
        score: The score name on the trace.
        item: The rubric item it decides (default: ``task_done``, which decides success).
        passed_at: Values at or above this pass the item.
        failed_below: Values below this fail it.
    """

    score: str
    item: str = "task_done"
    passed_at: float = 1.0
    failed_below: float = 0.5


def score_check(mapping: Sequence[ScoreEvidence]) -> RuleCheck:
    """A rule check that reads the app's recorded scores through ``mapping``."""
    rules = list(mapping)

    def check(e: Episode, rubric: Rubric) -> list[ItemResult]:
        out: list[ItemResult] = []
        for m in rules:
            item = rubric.item(m.item)
            value = e.scores.get(m.score)
            if item is None or not isinstance(value, int | float):
                continue
            passed = True if value >= m.passed_at else False if value < m.failed_below else None
            if passed is not None:
                out.append(
                    ItemResult(
                        id=item.id,
                        priority=item.priority,
                        passed=passed,
                        comment=f"recorded {m.score}={value:g}",
                    )
                )
        return out

    return check


@runtime_checkable
class EvolveEnvironment(Protocol):
    """What evolve needs of an environment (every member may be trivial).

    Attributes:
        name: Short name (also the tag a runner puts on the environment's traces).
        version: Bump it when the checker or the rubric items change: verdicts made with
            another version are judged again.

    Optional (read with ``getattr``, so plugins written before it still load):
    ``generic_signals``, ``"veto"`` (the default) or ``"advisory"``: whether generic signals
    can refute what the checker decided (see :class:`EnvironmentPlugin`).
    """

    name: str
    version: str

    def runtime(self, **options: Any) -> Environment | None:
        """The run-side environment (tasks and splits, tools, offline model), if any."""
        ...

    def checks(self) -> Sequence[RuleCheck]:
        """The app's checker(s) over an episode; empty when there is none."""
        ...

    def rubric_items(self, query: str) -> Sequence[RubricItem]:
        """Rubric items for ``query`` (they refine the built-in items with the same id)."""
        ...

    def case_key(self, query: str, metadata: Mapping[str, Any]) -> str:
        """The key that groups cases of the same task (strategies, lessons, rankings)."""
        ...

    def lesson_hints(self) -> Mapping[str, str]:
        """Rubric item id -> what to do instead, in the imperative (becomes a lesson)."""
        ...

    def score_evidence(self) -> Sequence[ScoreEvidence]:
        """Scores the app records on its traces that count as evidence."""
        ...

    def owns(self, episode: Episode) -> bool:
        """Whether ``episode`` comes from this environment."""
        ...


class EnvironmentPlugin:
    """A ready-made :class:`EvolveEnvironment`: pass what you have, the rest is generic.

    Args:
        name: Short name; by default an episode belongs to it when it carries this tag.
        version: Bump when the checker or the items change (re-grades old verdicts).
        checker: A rule check over an episode (results per rubric item id).
        items: Rubric items (or a callable of the query returning them).
        case_key: Groups cases (default :func:`default_case_key`).
        lesson_hints: Item id -> imperative instruction; items' own ``avoid_hint`` fill in.
        score_evidence: Recorded scores that count as evidence.
        runtime: Builds the run-side environment (``runtime(**options)``).
        owns: Whether an episode belongs here (default: tagged with ``name``).
        generic_signals: Whether generic signals can refute what ``checker`` decided.
            ``veto`` (default): a run that did nothing, ended on an error, claimed actions
            no call performed, was stopped in a loop, ... fails whatever the checker says.
            ``advisory``: the checker's verdict is final where it decided the outcome; the
            signals still deduct and become lessons. Choose ``advisory`` when the checker
            sees the whole outcome (a benchmark's grader, the app's ground truth).
    """

    def __init__(
        self,
        name: str,
        *,
        version: str = "1",
        checker: RuleCheck | None = None,
        items: Sequence[RubricItem] | Callable[[str], Sequence[RubricItem]] = (),
        case_key: CaseKey = default_case_key,
        lesson_hints: Mapping[str, str] | None = None,
        score_evidence: Sequence[ScoreEvidence] = (),
        runtime: Callable[..., Environment] | None = None,
        owns: Callable[[Episode], bool] | None = None,
        generic_signals: GenericSignals = "veto",
    ) -> None:
        if generic_signals not in ("veto", "advisory"):
            raise ConfigError(
                f"generic_signals must be 'veto' (a failed generic signal fails the run "
                f"whatever the checker says) or 'advisory' (the checker's verdict is final), "
                f"got {generic_signals!r}",
                field="generic_signals",
            )
        self.name = name
        self.generic_signals: GenericSignals = generic_signals
        self.version = version
        self._checker = checker
        self._items = items
        self._case_key = case_key
        self._hints = dict(lesson_hints or {})
        self._evidence = list(score_evidence)
        self._runtime = runtime
        self._owns = owns

    def runtime(self, **options: Any) -> Environment | None:
        return self._runtime(**options) if self._runtime is not None else None

    def checks(self) -> Sequence[RuleCheck]:
        return [self._checker] if self._checker is not None else []

    def rubric_items(self, query: str) -> Sequence[RubricItem]:
        return self._items(query) if callable(self._items) else list(self._items)

    def case_key(self, query: str, metadata: Mapping[str, Any]) -> str:
        return self._case_key(query, metadata)

    def lesson_hints(self) -> Mapping[str, str]:
        return self._hints

    def score_evidence(self) -> Sequence[ScoreEvidence]:
        return self._evidence

    def owns(self, episode: Episode) -> bool:
        if self._owns is not None:
            return self._owns(episode)
        return self.name in episode.tags


GENERIC = EnvironmentPlugin("generic", owns=lambda e: True)
"""No checker, no items: generic signals only (success stays undecided without evidence)."""


def load_plugin(spec: str) -> EvolveEnvironment:
    """The environment plugin behind ``spec``.

    ``spec`` is ``generic`` (or ``none``), a name registered in the
    ``evoharness.environments`` entry-point group, or ``package.module:Object``. The object
    may be a plugin or a zero-argument factory (a class or function) returning one. A
    run-side environment alone (tasks, tools, checker over messages) is not enough: wrap it
    in :class:`EnvironmentPlugin` with a checker over episodes.

    Raises:
        ConfigError: Unknown name, import failure, or not a plugin.
    """
    if spec in ("generic", "none"):
        return GENERIC
    obj = resolve_plugin(spec)
    if not isinstance(obj, EvolveEnvironment) and callable(obj):
        obj = call_plugin(spec, obj)
    if not isinstance(obj, EvolveEnvironment) or isinstance(obj, type):
        raise ConfigError(
            f"{spec!r} is not an evolve environment plugin; provide an object with name, "
            "version, runtime(), checks(), rubric_items(), case_key(), lesson_hints(), "
            "score_evidence() and owns() (evoharness.evolve.environment.EnvironmentPlugin "
            "builds one)",
            field="env",
        )
    return obj


def lesson_hints_of(env: EvolveEnvironment, queries: Sequence[str] = ("",)) -> dict[str, str]:
    """Item id -> imperative hint: the built-in items' hints, the environment's items' own
    hints, then the environment's explicit hints (later ones win; an empty hint removes)."""
    hints = {i.id: i.avoid_hint for i in BASE_ITEMS if i.avoid_hint}
    for q in queries:
        hints.update({i.id: i.avoid_hint for i in env.rubric_items(q) if i.avoid_hint})
    hints.update(env.lesson_hints())
    return {k: v for k, v in hints.items() if v}


def build_judge(env: EvolveEnvironment, llm: LLMJudge | None = None) -> Judge:
    """The judge for ``env``: generic checks, recorded-score evidence, the app's checker
    (later checks win per item), and optionally a model for what no rule decided.

    Whether generic signals can refute the checker's verdict is the plugin's optional
    ``generic_signals`` attribute (``veto`` when it has none; see :class:`EnvironmentPlugin`).
    """
    checks: list[RuleCheck] = [*DEFAULT_CHECKS]
    if env.score_evidence():
        checks.append(score_check(env.score_evidence()))
    signals = cast(GenericSignals, getattr(env, "generic_signals", "veto"))  # RuleJudge checks
    rules = RuleJudge(checks, checker=env.checks(), generic_signals=signals)
    return Judge(rules, llm=llm)


def build_rubrics(env: EvolveEnvironment, **options: Any) -> RubricGenerator:
    """The rubric generator for ``env`` (its items refine the built-in ones)."""
    return RubricGenerator(
        extra_items=env.rubric_items,
        env_version=f"{env.name}-{env.version}",
        environment=env.name,
        **options,
    )


def build_proposer(env: EvolveEnvironment) -> RuleProposer:
    """The rule proposer for ``env``: its case keys and its imperative lesson hints."""
    return RuleProposer(case_key=env.case_key, hints=lesson_hints_of(env))


def runtime_of(env: EvolveEnvironment, **options: Any) -> Environment:
    """``env``'s run-side environment.

    Raises:
        ConfigError: The plugin has no run side (nothing to run tasks on).
    """
    runtime = call_plugin(env.name, env.runtime, **options)
    if runtime is None:
        raise ConfigError(
            f"environment {env.name!r} has no run side (tasks, tools, offline model); "
            "give the plugin a runtime() that returns an evoharness.sdk Environment",
            field="env",
        )
    return runtime
