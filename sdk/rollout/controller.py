"""Run a prompt rollout: start it, resolve sessions to arms, apply and audit decisions.

Every state change is published to the registry before it takes effect, and every decision
(holds included) is published as a ``rollout_decision`` artifact: the registry's audit log is
the full history. Each operation that reads the experiment and then changes it (start,
evaluate, promote, rollback) runs as one registry transaction holding the rollout's lock
(:meth:`~evoharness.sdk.registry.Registry.transaction`), so app instances, schedulers and
operators racing on one prompt see each other's changes: one start wins, and a promote and a
rollback at the same instant end in one state that the labels agree with. Resolution reads
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
from evoharness.sdk.rollout.decision import Decision, DecisionEngine, Monitor, Outcome
from evoharness.sdk.rollout.experiment import (
    CONTROL,
    DECISION_KIND,
    DEFAULT_STAGES,
    ROLLOUT_KIND,
    Arm,
    Experiment,
    ExperimentStore,
)


@dataclass(frozen=True)
class Assignment:
    """Which prompt version a new session gets, and why.

    Attributes:
        prompt: The prompt name.
        version: The version to serve (``None``: the prompt has no active version).
        arm: The experiment arm (``None`` outside an experiment).
        experiment_id: The running experiment, if any.
    """

    prompt: str
    version: int | None
    arm: str | None = None
    experiment_id: str | None = None


class RolloutController:
    """Staged, sticky, audited prompt rollouts over a registry.

    Args:
        registry: Holds the experiment state and the decision log.
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

    # -- lifecycle -------------------------------------------------------------------------
    def _locked(self, prompt: str) -> AbstractContextManager[None]:
        """One registry transaction holding the rollout's lock for ``prompt`` (the rollout's
        lock is taken before the prompt's: the label moves inside nest in it)."""
        return self.registry.transaction(ROLLOUT_KIND, prompt)

    def start(
        self,
        prompt: str,
        candidates: int | Sequence[int] | Mapping[int, float],
        *,
        stages: Sequence[float] = DEFAULT_STAGES,
        min_dwell_s: float = 3600.0,
        tolerances: Mapping[str, float] | None = None,
        experiment_id: str | None = None,
        salt: str | None = None,
        actor: str = "evoharness",
        reason: str = "",
    ) -> Experiment:
        """Start rolling ``candidates`` out against the active version.

        Atomic across processes: of several starts of one prompt at the same instant, one
        starts and the others raise the :class:`ConfigError` below.

        Args:
            prompt: The prompt name (must have an active version: the control).
            candidates: One version, several, or version -> weight.
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
            ConfigError: An experiment is already running, there is no active version, a
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
        with self._locked(prompt):
            running = self.running(prompt)
            if running is not None:
                raise ConfigError(
                    f"prompt {prompt!r} already has a running rollout {running.id}: promote or "
                    "roll it back first (evoharness prompts promote|rollback)",
                    field="prompt",
                )
            control = self.prompts.labels(prompt).get(ACTIVE)
            if control is None:
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
                self.prompts.get(prompt, v)  # raises ArtifactNotFound for a missing version
            now = self.clock()
            try:
                exp = self._experiment(
                    prompt, control, weights, stages, min_dwell_s, tolerance, now, reason,
                    experiment_id, salt,
                )  # fmt: skip
            except ValidationError as exc:
                error = exc.errors()[0]
                raise ConfigError(
                    f"rollout of {prompt!r}: {error['msg']}",
                    field=str(error["loc"][0]) if error["loc"] else "stages",
                ) from exc
            if len(exp.candidates) == 1:
                self.prompts.set_label(
                    prompt, CANDIDATE, exp.candidates[0].version, actor=actor, reason=reason
                )
            self.experiments.save(exp, actor=actor, reason=f"start {exp.id}: {reason}".strip())
        return exp

    @staticmethod
    def _experiment(
        prompt: str,
        control: int,
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

    def current(self, prompt: str) -> Experiment | None:
        """The latest experiment of ``prompt`` (running or ended)."""
        return self.experiments.current(prompt)

    def running(self, prompt: str) -> Experiment | None:
        """The running experiment of ``prompt``, if any."""
        exp = self.current(prompt)
        return exp if exp is not None and exp.running else None

    # -- the runtime -----------------------------------------------------------------------
    def resolve(self, prompt: str, unit: str) -> Assignment:
        """The version a new session of ``unit`` (user id, else session id) gets now."""
        exp = self.running(prompt)
        if exp is not None:
            arm = exp.assign(unit)
            return Assignment(prompt, arm.version, arm.name, exp.id)
        return Assignment(prompt, self.prompts.active_version(prompt))

    # -- decisions -------------------------------------------------------------------------
    def monitor(self, prompt: str) -> Monitor:
        """An incremental monitor for the running experiment (feed it, then :meth:`evaluate`).

        Raises:
            ConfigError: No running experiment.
        """
        return self.engine.monitor(self._require_running(prompt))

    def _require_running(self, prompt: str) -> Experiment:
        exp = self.running(prompt)
        if exp is None:
            raise ConfigError(
                f"prompt {prompt!r} has no running rollout: start one with "
                "evoharness prompts rollout NAME VERSION",
                field="prompt",
            )
        return exp

    def evaluate(
        self,
        prompt: str,
        outcomes: Mapping[str, Sequence[Outcome]] | None = None,
        *,
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
        exp = self._require_running(prompt)
        decision = self._decide(exp, outcomes, monitor)
        with self._locked(prompt):
            latest = self._require_running(prompt)
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
            self.prompts.promote(exp.prompt, arm.version, actor=d.actor, reason=d.reason)
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
        unlabel = getattr(self.prompts, "unlabel", None)
        if unlabel is not None and CANDIDATE in self.prompts.labels(exp.prompt):
            unlabel(exp.prompt, CANDIDATE, actor=d.actor, reason=d.reason)

    def rollback(self, prompt: str, *, reason: str, actor: str = "evoharness") -> Decision:
        """Roll back now: end the running experiment (everyone new gets the control), or,
        with none running, restore the version active before the last promote.

        Atomic across processes with :meth:`promote` and :meth:`evaluate`: racing a promote,
        either the rollback ends the experiment (and the promote finds nothing running) or
        the promote completes first and this restores the version active before it.
        """
        with self._locked(prompt):
            exp = self.running(prompt)
            if exp is not None:
                d = Decision(
                    experiment_id=exp.id,
                    action="rollback",
                    reason=f"manual: {reason}",
                    stage=exp.stage,
                    to_stage=exp.stage,
                    at=self.clock(),
                    actor=actor,
                )
                self._record(d)
                self._apply(exp, d)
                return d
            restored = self.prompts.rollback(prompt, actor=actor, reason=reason)
            last = self.current(prompt)
            d = Decision(
                experiment_id=last.id if last is not None else f"{prompt}-manual",
                action="rollback",
                reason=f"manual: {reason} (restored v{restored})",
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
        with self._locked(prompt):
            return self._promote(prompt, reason=reason, version=version, actor=actor)

    def _promote(self, prompt: str, *, reason: str, version: int | None, actor: str) -> Decision:
        exp = self.running(prompt)
        if exp is None:
            if version is None:
                raise ConfigError(
                    f"prompt {prompt!r} has no running rollout: name the version to promote",
                    field="version",
                )
            self.prompts.promote(prompt, version, actor=actor, reason=reason)
            d = Decision(
                experiment_id=f"{prompt}-manual",
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
        d = Decision(
            experiment_id=exp.id,
            action="promote",
            reason=f"manual: {reason}",
            arm=arm.name,
            stage=exp.stage,
            to_stage=len(exp.stages) - 1,
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
