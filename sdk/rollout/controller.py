"""Run a rollout of any artifact kind: start it, resolve sessions to arms, apply and audit
decisions.

Prompt versions, memory snapshots, guard-rule versions, adapter versions and skill sets are
rolled out the same way (sticky assignment, stages, always-valid decisions, guard rollback):
every method takes the artifact's name and a ``kind`` (default ``prompt``, so the prompt API
reads as it always did). A prompt's labels move in its prompt store; every other kind's in
the registry (:class:`~evoharness.sdk.rollout.labels.RegistryLabels`).

Every state change is published to the registry before it takes effect, and every decision
(holds included) is published as a ``rollout_decision`` artifact: the registry's audit log is
the full history. Each operation that reads the experiment and then changes it (start,
evaluate, promote, rollback) runs as one registry transaction holding the rollout's lock
(:meth:`~evoharness.sdk.registry.Registry.transaction`), so app instances, schedulers and
operators racing on one artifact see each other's changes: one start wins, and a promote and
a rollback at the same instant end in one state that the labels agree with. Resolution reads
the registry on every new session, so a rollback reaches all new sessions at once; sessions
already running keep the version they were pinned to (:class:`~evoharness.sdk.agent.EvoAgent`
resolves once per session).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from pydantic import ValidationError

from evoharness.harness.errors import ConfigError
from evoharness.sdk.prompts.store import ACTIVE, CANDIDATE, PromptStore, RegistryPromptStore
from evoharness.sdk.registry.base import Registry
from evoharness.sdk.rollout.decision import Action, Decision, DecisionEngine, Monitor, Outcome
from evoharness.sdk.rollout.experiment import (
    CONTROL,
    DECISION_KIND,
    DEFAULT_STAGES,
    PROMPT,
    ROLLOUT_KIND,
    Arm,
    Experiment,
    ExperimentStore,
    rollout_name,
)
from evoharness.sdk.rollout.labels import RegistryLabels


@dataclass(frozen=True)
class Assignment:
    """Which version of an artifact a new session gets, and why.

    Attributes:
        prompt: The artifact's name (the prompt's, for a prompt).
        version: The version to serve (``None``: nothing is active).
        arm: The experiment arm (``None`` outside an experiment).
        experiment_id: The running experiment, if any.
        kind: The artifact kind.
    """

    prompt: str
    version: int | None
    arm: str | None = None
    experiment_id: str | None = None
    kind: str = PROMPT


class RolloutController:
    """Staged, sticky, audited rollouts of any artifact kind over a registry.

    Args:
        registry: Holds the experiment state and the decision log (and the labels of every
            kind but prompts kept elsewhere).
        prompts: Where the prompt versions and their labels live (default: the same
            registry; pass a :class:`~evoharness.sdk.prompts.LangfusePromptStore` to move
            Langfuse labels instead).
        engine: The decision engine (defaults: :class:`DecisionEngine`); an experiment's own
            ``tolerances`` (set at :meth:`start`) override its metrics' tolerances.
        clock: Time source (injectable for simulations).

    Example:
        >>> from evoharness.sdk.registry import open_registry
        >>> from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore
        >>> reg = open_registry("sqlite://")
        >>> store = RegistryPromptStore(reg)
        >>> v1 = store.create("shop", PromptTemplate.from_text("Be brief."))
        >>> store.promote("shop", v1.version)
        >>> v2 = store.create("shop", PromptTemplate.from_text("Be brief and kind."))
        >>> rollout = RolloutController(reg)
        >>> exp = rollout.start("shop", v2.version, min_dwell_s=0)
        >>> rollout.resolve("shop", "user-1").version in (1, 2)
        True
        >>> snapshot = reg.publish("memory", "default", [{"id": "l-1"}])
        >>> exp = rollout.start("default", snapshot.version, kind="memory", min_dwell_s=0)
        >>> rollout.resolve("default", "user-1", kind="memory").arm in ("control", "v1")
        True
    """

    def __init__(
        self,
        registry: Registry,
        prompts: PromptStore | None = None,
        *,
        engine: DecisionEngine | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.prompts: PromptStore = prompts or RegistryPromptStore(registry)
        self.experiments = ExperimentStore(registry)
        self.engine = engine or DecisionEngine()
        self.clock = clock

    def labels_of(self, kind: str) -> PromptStore | RegistryLabels:
        """Where ``kind``'s labels move: the prompt store for prompts, else the registry."""
        return self.prompts if kind == PROMPT else RegistryLabels(self.registry, kind)

    # -- lifecycle -------------------------------------------------------------------------
    def _locked(self, name: str, kind: str) -> AbstractContextManager[None]:
        """One registry transaction holding the rollout's lock for ``kind/name`` (the
        rollout's lock is taken before the artifact's: the label moves inside nest in it)."""
        return self.registry.transaction(ROLLOUT_KIND, rollout_name(kind, name))

    def start(
        self,
        prompt: str,
        candidates: int | Sequence[int] | Mapping[int, float],
        *,
        kind: str = PROMPT,
        stages: Sequence[float] = DEFAULT_STAGES,
        min_dwell_s: float = 3600.0,
        tolerances: Mapping[str, float] | None = None,
        experiment_id: str | None = None,
        salt: str | None = None,
        actor: str = "evoharness",
        reason: str = "",
    ) -> Experiment:
        """Start rolling ``candidates`` out against the active version.

        Atomic across processes: of several starts of one artifact at the same instant, one
        starts and the others raise the :class:`ConfigError` below.

        Args:
            prompt: The artifact's name (a prompt's must have an active version: the
                control; any other kind without one is rolled out against nothing served).
            candidates: One version, several, or version -> weight.
            kind: The artifact kind (``prompt``, ``memory``, ``guard_rules``, ``adapter``,
                ``skills``, ...).
            stages: Exposed traffic per stage, ending at 1.0.
            min_dwell_s: Least time per stage.
            tolerances: Metric name -> allowed worsening for this experiment, overriding the
                engine's (:attr:`DecisionEngine.tolerances`), in each metric's terms:
                ``{"tokens": 0.25}`` lets a winner cost up to 25% more tokens (relative),
                ``{"tool_failure_rate": 0.05}`` five points more failed tool calls.
                Stored with the experiment: whoever evaluates it applies them.
            experiment_id: Defaults to a fresh id.
            salt: Bucketing salt (defaults to the experiment id).
            actor: Who started it (audited).
            reason: Why (audited).

        Raises:
            ConfigError: An experiment is already running, a prompt has no active version, a
                candidate is the active version, or stages, dwell or tolerances are invalid
                (an unknown metric name among them).
        """
        if isinstance(candidates, int):
            weights: dict[int, float] = {candidates: 1.0}
        elif isinstance(candidates, Mapping):
            weights = {int(k): float(v) for k, v in candidates.items()}
        else:
            weights = dict.fromkeys((int(c) for c in candidates), 1.0)
        tolerance = self.engine.check_tolerances(tolerances or {})
        labels = self.labels_of(kind)
        what = "prompt" if kind == PROMPT else kind
        with self._locked(prompt, kind):
            running = self.running(prompt, kind=kind)
            if running is not None:
                raise ConfigError(
                    f"{what} {prompt!r} already has a running rollout {running.id}: promote or "
                    f"roll it back first (evoharness rollout promote|rollback {kind} {prompt})",
                    field="prompt",
                )
            control = labels.labels(prompt).get(ACTIVE)
            if control is None and kind == PROMPT:
                raise ConfigError(
                    f"prompt {prompt!r} has no active version to compare against: promote one "
                    "first (evoharness prompts promote NAME VERSION)",
                    field="prompt",
                )
            if control in weights:
                raise ConfigError(
                    f"v{control} is already active; a rollout needs a different candidate version",
                    field="candidates",
                )
            for v in weights:
                labels.get(prompt, v)  # raises ArtifactNotFound for a missing version
            now = self.clock()
            try:
                exp = self._experiment(
                    prompt, kind, control, weights, stages, min_dwell_s, tolerance, now,
                    reason, experiment_id, salt,
                )  # fmt: skip
            except ValidationError as exc:
                error = exc.errors()[0]
                raise ConfigError(
                    f"rollout of {kind}/{prompt}: {error['msg']}",
                    field=str(error["loc"][0]) if error["loc"] else "stages",
                ) from exc
            if len(exp.candidates) == 1:
                version = exp.candidates[0].version
                assert version is not None  # a candidate always serves a version
                labels.set_label(prompt, CANDIDATE, version, actor=actor, reason=reason)
            self.experiments.save(exp, actor=actor, reason=f"start {exp.id}: {reason}".strip())
        return exp

    @staticmethod
    def _experiment(
        prompt: str,
        kind: str,
        control: int | None,
        weights: dict[int, float],
        stages: Sequence[float],
        min_dwell_s: float,
        tolerances: dict[str, float],
        now: float,
        reason: str,
        experiment_id: str | None,
        salt: str | None,
    ) -> Experiment:
        return Experiment(
            **({"id": experiment_id} if experiment_id else {}),
            prompt=prompt,
            kind=kind,
            salt=salt or "",
            control=Arm(name=CONTROL, version=control),
            candidates=[Arm(name=f"v{v}", version=v, weight=w) for v, w in weights.items()],
            stages=list(stages),
            started_at=now,
            stage_started_at=now,
            min_dwell_s=min_dwell_s,
            tolerances=tolerances,
            reason=reason or "started",
        )

    def current(self, prompt: str, *, kind: str = PROMPT) -> Experiment | None:
        """The latest experiment of ``kind/prompt`` (running or ended)."""
        return self.experiments.current(prompt, kind=kind)

    def running(self, prompt: str, *, kind: str = PROMPT) -> Experiment | None:
        """The running experiment of ``kind/prompt``, if any."""
        exp = self.current(prompt, kind=kind)
        return exp if exp is not None and exp.running else None

    # -- the runtime -----------------------------------------------------------------------
    def resolve(self, prompt: str, unit: str, *, kind: str = PROMPT) -> Assignment:
        """The version a new session of ``unit`` (user id, else session id) gets now: its
        arm of the running rollout, else the active version."""
        exp = self.running(prompt, kind=kind)
        if exp is not None:
            arm = exp.assign(unit)
            return Assignment(prompt, arm.version, arm.name, exp.id, kind)
        if kind == PROMPT:  # the prompt store's own cheap read (Langfuse caches it)
            return Assignment(prompt, self.prompts.active_version(prompt))
        return Assignment(prompt, self.labels_of(kind).labels(prompt).get(ACTIVE), kind=kind)

    def arm_for(self, prompt: str, unit: str, *, kind: str = PROMPT) -> Assignment | None:
        """``unit``'s arm of the running rollout of ``kind/prompt`` (``None`` when none runs:
        the caller serves its own label)."""
        exp = self.running(prompt, kind=kind)
        if exp is None:
            return None
        arm = exp.assign(unit)
        return Assignment(prompt, arm.version, arm.name, exp.id, kind)

    # -- decisions -------------------------------------------------------------------------
    def monitor(self, prompt: str, *, kind: str = PROMPT) -> Monitor:
        """An incremental monitor for the running experiment (feed it, then :meth:`evaluate`).

        Raises:
            ConfigError: No running experiment.
        """
        return self.engine.monitor(self._require_running(prompt, kind))

    def _require_running(self, prompt: str, kind: str) -> Experiment:
        exp = self.running(prompt, kind=kind)
        if exp is None:
            start = (
                "evoharness prompts rollout NAME VERSION"
                if kind == PROMPT
                else f"evoharness rollout start {kind} {prompt} VERSION"
            )
            raise ConfigError(
                f"{kind} {prompt!r} has no running rollout: start one with {start}",
                field="prompt",
            )
        return exp

    def evaluate(
        self,
        prompt: str,
        outcomes: Mapping[str, Sequence[Outcome]] | None = None,
        *,
        kind: str = PROMPT,
        monitor: Monitor | None = None,
        apply: bool = True,
    ) -> Decision:
        """Decide on the running experiment, audit the decision, and apply it.

        Pass either all ``outcomes`` so far (arm -> sessions) or an incremental ``monitor``
        (its experiment is refreshed after a stage change). The statistics run outside the
        rollout's lock; the decision is recorded and applied under it, and made again on the
        state found there when another process changed the experiment meanwhile.

        Raises:
            ConfigError: No running experiment (or it ended meanwhile).
        """
        exp = self._require_running(prompt, kind)
        decision = self._decide(exp, outcomes, monitor)
        with self._locked(prompt, kind):
            latest = self._require_running(prompt, kind)
            if latest != exp:  # a stage change, a promote or a rollback got there first
                exp, decision = latest, self._decide(latest, outcomes, monitor)
            self._record(decision)
            if apply:
                self._apply(exp, decision)
        return decision

    def _decide(
        self,
        exp: Experiment,
        outcomes: Mapping[str, Sequence[Outcome]] | None,
        monitor: Monitor | None,
    ) -> Decision:
        if monitor is not None:
            monitor.experiment = exp
            return self.engine.decide(monitor, now=self.clock())
        return self.engine.decide_outcomes(exp, outcomes or {}, now=self.clock())

    def _record(self, decision: Decision) -> None:
        self.registry.publish(
            DECISION_KIND,
            decision.experiment_id,
            decision.model_dump(mode="json"),
            metadata={"action": decision.action, "reason": decision.reason},
            author=decision.actor,
        )

    def _apply(self, exp: Experiment, d: Decision) -> Experiment:
        now = self.clock()
        if d.action == "hold":
            return exp
        if d.action == "promote" and d.to_stage < len(exp.stages) - 1:
            exp = exp.model_copy(update={"stage": d.to_stage, "stage_started_at": now})
        elif d.action == "promote":
            arm = exp.arm(d.arm or exp.candidates[0].name)
            assert arm.version is not None  # only a control serves nothing
            self.labels_of(exp.kind).promote(
                exp.prompt, arm.version, actor=d.actor, reason=d.reason
            )
            self._drop_candidate(exp, d)
            exp = exp.model_copy(
                update={
                    "stage": len(exp.stages) - 1,
                    "stage_started_at": now,
                    "status": "promoted",
                    "winner": arm.name,
                    "ended_at": now,
                }
            )
        else:
            self._drop_candidate(exp, d)
            exp = exp.model_copy(update={"status": "rolled_back", "ended_at": now})
        exp.reason = d.reason
        self.experiments.save(exp, actor=d.actor, reason=f"{d.action}: {d.reason}")
        return exp

    def _drop_candidate(self, exp: Experiment, d: Decision) -> None:
        labels = self.labels_of(exp.kind)
        unlabel = getattr(labels, "unlabel", None)
        candidate = labels.labels(exp.prompt).get(CANDIDATE)
        ours = {a.version for a in exp.candidates}
        if unlabel is not None and candidate is not None and candidate in ours:
            unlabel(exp.prompt, CANDIDATE, actor=d.actor, reason=d.reason)

    def rollback(
        self, prompt: str, *, reason: str, kind: str = PROMPT, actor: str = "evoharness"
    ) -> Decision:
        """Roll back now: end the running experiment (everyone new gets the control), or,
        with none running, restore the version active before the last promote.

        Atomic across processes with :meth:`promote` and :meth:`evaluate`: racing a promote,
        either the rollback ends the experiment (and the promote finds nothing running) or
        the promote completes first and this restores the version active before it.
        """
        with self._locked(prompt, kind):
            exp = self.running(prompt, kind=kind)
            if exp is not None:
                return self._act(exp, "rollback", reason=reason, actor=actor, to_stage=exp.stage)
            restored = self.labels_of(kind).rollback(prompt, actor=actor, reason=reason)
            last = self.current(prompt, kind=kind)
            d = Decision(
                experiment_id=last.id
                if last is not None
                else f"{rollout_name(kind, prompt)}-manual",
                action="rollback",
                reason=f"manual: {reason} (restored "
                + (f"v{restored})" if restored is not None else "nothing: none was earlier)"),
                at=self.clock(),
                actor=actor,
            )
            self._record(d)
            return d

    def promote(
        self,
        prompt: str,
        *,
        reason: str,
        kind: str = PROMPT,
        version: int | None = None,
        actor: str = "evoharness",
    ) -> Decision:
        """Promote now: the running experiment's candidate (or ``version`` among them) goes to
        full traffic; with no experiment running, ``version`` becomes active.

        Atomic across processes: of two promotes at once one promotes, the other finds no
        running experiment.

        Raises:
            ConfigError: Nothing to promote (no experiment and no ``version``).
        """
        with self._locked(prompt, kind):
            return self._promote(prompt, kind, reason=reason, version=version, actor=actor)

    def _promote(
        self, prompt: str, kind: str, *, reason: str, version: int | None, actor: str
    ) -> Decision:
        exp = self.running(prompt, kind=kind)
        if exp is None:
            if version is None:
                raise ConfigError(
                    f"{kind} {prompt!r} has no running rollout: name the version to promote",
                    field="version",
                )
            self.labels_of(kind).promote(prompt, version, actor=actor, reason=reason)
            d = Decision(
                experiment_id=f"{rollout_name(kind, prompt)}-manual",
                action="promote",
                reason=f"manual: {reason} (v{version} active)",
                at=self.clock(),
                actor=actor,
            )
            self._record(d)
            return d
        arm = next((a for a in exp.candidates if version in (None, a.version)), None)
        if arm is None:
            raise ConfigError(
                f"v{version} is not a candidate of {exp.id} "
                f"({[a.version for a in exp.candidates]})",
                field="version",
            )
        return self._act(
            exp, "promote", reason=reason, actor=actor, to_stage=len(exp.stages) - 1, arm=arm.name
        )

    def _act(
        self,
        exp: Experiment,
        action: Action,
        *,
        reason: str,
        actor: str,
        to_stage: int,
        arm: str | None = None,
    ) -> Decision:
        """Record a manual ``action`` on the running ``exp`` and apply it."""
        d = Decision(
            experiment_id=exp.id,
            action=action,
            reason=f"manual: {reason}",
            arm=arm,
            stage=exp.stage,
            to_stage=to_stage,
            at=self.clock(),
            actor=actor,
        )
        self._record(d)
        self._apply(exp, d)
        return d

    def decisions(self, experiment_id: str) -> list[Decision]:
        """The audited decisions of one experiment, oldest first."""
        return [
            Decision.model_validate(v.content)
            for v in self.registry.versions(DECISION_KIND, experiment_id)
        ]


def assignment_for(
    rollout: RolloutController | None,
    registry: Registry,
    kind: str,
    name: str,
    unit: str,
    *,
    label: str = ACTIVE,
) -> Assignment:
    """What a session source serves ``unit`` of ``kind/name``: its arm of the running rollout
    (sticky), else the version ``label`` points at (``None``: nothing yet)."""
    arm = rollout.arm_for(name, unit, kind=kind) if rollout is not None else None
    if arm is not None:
        return arm
    return Assignment(name, registry.labels(kind, name).get(label), kind=kind)
