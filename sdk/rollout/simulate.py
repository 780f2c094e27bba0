"""A SIMULATED rollout: drive a real controller and decision engine with simulated sessions.

For demos and tests: the registry, the sticky assignment, the stages, the statistics and the
audit log are the real ones; only the sessions are simulated (by ``run_session``, e.g. the
shop's offline policy model, or by Bernoulli draws at given success rates) and the clock is
simulated (each look advances it by ``look_s``). Everything this module reports is labelled
simulated.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from evoharness.sdk.prompts.store import PromptStore
from evoharness.sdk.prompts.template import PromptVersion
from evoharness.sdk.registry.base import Registry
from evoharness.sdk.rollout.controller import RolloutController
from evoharness.sdk.rollout.decision import Decision, DecisionEngine, Outcome
from evoharness.sdk.rollout.experiment import DEFAULT_STAGES

#: ``run_session(version, user_id, rng) -> Outcome``: one simulated session.
SessionRunner = Callable[[PromptVersion, str, random.Random], Outcome]


@dataclass
class LookRecord:
    """One look of a simulated rollout."""

    look: int
    traffic: float
    n: dict[str, int]
    decision: Decision


@dataclass
class SimulationReport:
    """What a simulated rollout did (``simulated`` is always True)."""

    experiment_id: str
    looks: list[LookRecord] = field(default_factory=list)
    final_status: str = "running"
    active_version: int | None = None
    simulated: bool = True

    @property
    def decision(self) -> Decision | None:
        """The last decision."""
        return self.looks[-1].decision if self.looks else None

    def lines(self) -> list[str]:
        """Human-readable lines, each marked as simulated."""
        out = [f"[simulated] rollout {self.experiment_id}"]
        for r in self.looks:
            if r.decision.action != "hold" or r is self.looks[-1]:
                out.append(_line(r))
        out.append(f"[simulated] final: {self.final_status}, active version v{self.active_version}")
        return out


def bernoulli_sessions(
    success: Mapping[int, float], p0: Mapping[int, float] | None = None
) -> SessionRunner:
    """A runner whose sessions succeed with ``success[version]`` (and hit a P0 with
    ``p0[version]``): known true rates, for tests and the rollout bench."""

    def run(version: PromptVersion, user: str, rng: random.Random) -> Outcome:
        return Outcome(
            success=float(rng.random() < success[version.version]),
            p0=rng.random() < (p0 or {}).get(version.version, 0.0),
            tool_calls=2,
            input_tokens=1000,
            output_tokens=200,
            latency_s=1.0,
        )

    return run


def simulate_rollout(
    registry: Registry,
    prompt: str,
    candidate: int,
    *,
    run_session: SessionRunner | None = None,
    success: Mapping[int, float] | None = None,
    prompts: PromptStore | None = None,
    sessions_per_look: int = 100,
    max_looks: int = 200,
    users: int = 100_000,
    stages: Sequence[float] = DEFAULT_STAGES,
    min_dwell_s: float = 1800.0,
    look_s: float = 600.0,
    engine: DecisionEngine | None = None,
    seed: int = 0,
    echo: Callable[[str], None] | None = None,
) -> SimulationReport:
    """Roll ``candidate`` out against the active version of ``prompt`` with SIMULATED sessions.

    Each look draws ``sessions_per_look`` users, resolves each to an arm through the real
    controller (sticky, staged), runs a simulated session with that arm's version, feeds the
    engine, and applies its decision; it stops at a promotion to full traffic, a rollback or
    ``max_looks``.

    Args:
        registry: The registry holding the prompt (and receiving the audit log).
        prompt: The prompt name (needs an active version).
        candidate: The version to roll out.
        run_session: Runs one simulated session; default: :func:`bernoulli_sessions` over
            ``success``.
        success: Version -> true success rate, for the default runner.
        prompts: The prompt store (defaults to the registry's).
        sessions_per_look: Sessions between two looks.
        max_looks: Upper bound on looks.
        users: Size of the simulated user population.
        stages: Traffic stages.
        min_dwell_s: Dwell per stage, in simulated seconds.
        look_s: Simulated seconds between looks.
        engine: Decision engine (default settings otherwise).
        seed: Random seed (also fixes the bucketing salt: a run is reproducible).
        echo: Receives each report line as it happens.

    Returns:
        The :class:`SimulationReport` (``simulated=True``).
    """
    if run_session is None:
        if success is None:
            raise ValueError("pass run_session=... or success={version: rate, ...}")
        run_session = bernoulli_sessions(success)
    now = [0.0]
    ctl = RolloutController(registry, prompts, engine=engine, clock=lambda: now[0])
    exp = ctl.start(
        prompt,
        candidate,
        stages=stages,
        min_dwell_s=min_dwell_s,
        salt=f"simulation-{seed}",
        actor="simulation",
        reason="simulated rollout",
    )
    report = SimulationReport(exp.id)
    rng = random.Random(seed)
    mon = ctl.monitor(prompt)
    versions: dict[int, PromptVersion] = {}
    for look in range(1, max_looks + 1):
        now[0] += look_s
        current = ctl.running(prompt)
        if current is None:
            break
        by_arm: dict[str, list[Outcome]] = {}
        for _ in range(sessions_per_look):
            user = f"sim-user-{rng.randrange(users)}"
            a = ctl.resolve(prompt, user)
            assert a.version is not None and a.arm is not None
            if a.version not in versions:
                versions[a.version] = ctl.prompts.get(prompt, a.version)
            by_arm.setdefault(a.arm, []).append(run_session(versions[a.version], user, rng))
        for arm, rows in by_arm.items():
            mon.add(arm, rows)
        d = ctl.evaluate(prompt, monitor=mon)
        report.looks.append(LookRecord(look, current.traffic, mon.n, d))
        if echo is not None and (d.action != "hold" or look == max_looks):
            echo(_line(report.looks[-1]))
        if d.action == "rollback" or (d.action == "promote" and d.to_stage == len(stages) - 1):
            break
    final = ctl.current(prompt)
    report.final_status = final.status if final is not None else "unknown"
    report.active_version = ctl.prompts.labels(prompt).get("active")
    if echo is not None:
        echo(report.lines()[-1])
    return report


def _line(r: LookRecord) -> str:
    arms = " ".join(f"{k}={v}" for k, v in r.n.items())
    return (
        f"[simulated] look {r.look:>3} traffic {r.traffic:>4.0%} {arms}: "
        f"{r.decision.action} - {r.decision.reason}"
    )
