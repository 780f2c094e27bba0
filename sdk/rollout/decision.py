"""The decision engine: per-arm session outcomes in, promote / hold / rollback (with a reason).

Metrics per session (:class:`Outcome`): the rubric total or task success (primary), P0
failure and run error (guards), tool-failure rate, cache-adjusted tokens, latency
(secondaries). Every comparison is an always-valid confidence sequence for
``candidate - control`` (:class:`~evoharness.sdk.rollout.stats.SequentialComparison`), so the
engine may decide after every batch.

Rules, in order:

1. Too few sessions in an arm: **hold**.
2. A guard metric is significantly worse for a candidate (the interval lies above the
   tolerance): **rollback** at once, whatever the stage or dwell.
3. The primary metric is significantly worse for every candidate: **rollback**.
4. The stage's minimum dwell has not passed: **hold**.
5. Before the last partial stage: **promote** to the next stage (ramp; safety is rules 2–3).
6. At the last partial stage, a candidate whose primary metric is significantly better and
   no secondary metric significantly worse beyond its tolerance: **promote** (full traffic,
   the candidate becomes active). Otherwise, past ``max_samples`` per arm: **rollback**
   (no win: futility); else **hold**.

Cost compares *cache-adjusted* tokens (input + output, cached input counted as uncached): a
new prompt version starts with a cold provider prefix cache, which must not count against it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from evoharness.harness.errors import ConfigError
from evoharness.sdk.rollout.experiment import Experiment
from evoharness.sdk.rollout.stats import Interval, SequentialComparison

Action = Literal["promote", "hold", "rollback"]
Role = Literal["primary", "guard", "secondary"]


class Outcome(BaseModel):
    """What one session of an arm produced (read from its trace and scores).

    Attributes:
        success: Rubric total (or 0/1 task success); higher is better.
        p0: A P0 (must-never-happen) failure was found.
        error: The run raised.
        tool_calls: Tool calls made.
        tool_failures: Tool calls that failed.
        input_tokens: Input tokens, cached ones included.
        output_tokens: Output tokens.
        cached_input_tokens: Input tokens served from the provider's cache.
        latency_s: Wall time of the session.
    """

    model_config = ConfigDict(extra="forbid")

    success: float = 0.0
    p0: bool = False
    error: bool = False
    tool_calls: int = Field(default=0, ge=0)
    tool_failures: int = Field(default=0, ge=0)
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cached_input_tokens: int = Field(default=0, ge=0)
    latency_s: float = Field(default=0.0, ge=0)

    @property
    def cache_adjusted_tokens(self) -> int:
        """Tokens as if nothing were cached: a cold cache does not count against a version."""
        return self.input_tokens + self.output_tokens

    @property
    def tool_failure_rate(self) -> float:
        """Failed tool calls / tool calls (0 without tool calls)."""
        return self.tool_failures / self.tool_calls if self.tool_calls else 0.0


@dataclass(frozen=True)
class Metric:
    """A compared metric.

    Attributes:
        name: Name in reports.
        value: Extracts the value from an outcome.
        role: ``primary`` (decides promotion), ``guard`` (immediate rollback on a
            significant breach) or ``secondary`` (blocks promotion when significantly worse).
        higher_is_better: Direction.
        tolerance: Allowed worsening before it counts: absolute units, or a fraction of the
            control mean when ``relative``.
        relative: Whether ``tolerance`` is relative.
    """

    name: str
    value: Callable[[Outcome], float]
    role: Role
    higher_is_better: bool
    tolerance: float = 0.0
    relative: bool = False

    def margin(self, control_mean: float) -> float:
        """The tolerance in the metric's units."""
        return self.tolerance * abs(control_mean) if self.relative else self.tolerance

    def worse(self, iv: Interval) -> bool:
        """Significantly worse than the control by more than the tolerance."""
        m = self.margin(iv.mean_control)
        return iv.high < -m if self.higher_is_better else iv.low > m

    def better(self, iv: Interval) -> bool:
        """Significantly better than the control."""
        return iv.low > 0 if self.higher_is_better else iv.high < 0

    def tolerance_text(self, control_mean: float) -> str:
        """The tolerance as a reason states it: ``+10% of control = 110`` or ``0.02``."""
        if self.relative:
            return f"{self.tolerance:+.0%} of control = {self.margin(control_mean):.4g}"
        return f"{self.tolerance:.4g}"

    def describe(self, iv: Interval) -> str:
        """``tokens +412.000 [301.000, 523.000]``: the metric named with its own interval."""
        return f"{self.name} {iv.describe()}"


DEFAULT_METRICS: tuple[Metric, ...] = (
    Metric("success", lambda o: o.success, "primary", True),
    Metric("p0_rate", lambda o: float(o.p0), "guard", False),
    Metric("error_rate", lambda o: float(o.error), "guard", False),
    Metric("tool_failure_rate", lambda o: o.tool_failure_rate, "secondary", False, 0.02),
    Metric("tokens", lambda o: float(o.cache_adjusted_tokens), "secondary", False, 0.10, True),
    Metric("latency_s", lambda o: o.latency_s, "secondary", False, 0.20, True),
)


class Decision(BaseModel):
    """One decision of the engine (audited in the registry).

    Attributes:
        experiment_id: The experiment decided on.
        action: ``promote`` (next stage, or full promotion from the last partial stage),
            ``hold`` or ``rollback``.
        reason: Why, in one line with the numbers.
        arm: The candidate the action is about (the winner or the offender).
        stage: Stage index when decided.
        to_stage: Stage index after the decision (full promotion = the last stage).
        intervals: ``"<arm>.<metric>" -> "estimate [low, high]"``.
        n: Sessions per arm.
        at: Unix time.
        actor: Who decided (``rollout-engine`` or a person via the CLI).
    """

    model_config = ConfigDict(extra="forbid")

    experiment_id: str
    action: Action
    reason: str
    arm: str | None = None
    stage: int = 0
    to_stage: int = 0
    intervals: dict[str, str] = Field(default_factory=dict)
    n: dict[str, int] = Field(default_factory=dict)
    at: float = Field(default_factory=time.time)
    actor: str = "rollout-engine"


@dataclass
class Monitor:
    """Incremental per-metric comparisons of every candidate against the control.

    Feed outcomes as they arrive (:meth:`add`) and ask :meth:`DecisionEngine.decide` after
    any batch; the comparisons keep their always-valid state between looks.
    """

    experiment: Experiment
    metrics: Sequence[Metric]
    alpha: float
    guard_alpha: float
    _cmp: dict[tuple[str, str], SequentialComparison] = field(default_factory=dict)
    _n: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for cand in self.experiment.candidates:
            for m in self.metrics:
                a = self.guard_alpha if m.role == "guard" else self.alpha
                self._cmp[(cand.name, m.name)] = SequentialComparison(alpha=a)
        self._n = {a.name: 0 for a in [self.experiment.control, *self.experiment.candidates]}

    def add(self, arm: str, outcomes: Sequence[Outcome]) -> None:
        """Record sessions of ``arm`` (control sessions feed every comparison)."""
        if arm not in self._n:
            raise KeyError(f"experiment {self.experiment.id} has no arm {arm!r}")
        self._n[arm] += len(outcomes)
        for (cand, metric_name), cmp in self._cmp.items():
            if arm not in (cand, self.experiment.control.name):
                continue
            m = next(x for x in self.metrics if x.name == metric_name)
            cmp.add(arm == cand, [m.value(o) for o in outcomes])

    @property
    def n(self) -> dict[str, int]:
        """Sessions per arm so far."""
        return dict(self._n)

    def interval(self, candidate: str, metric: str) -> Interval:
        """The current interval of one candidate on one metric."""
        return self._cmp[(candidate, metric)].interval()


class DecisionEngine:
    """Turns per-arm outcomes into a :class:`Decision`.

    Args:
        metrics: The compared metrics (default :data:`DEFAULT_METRICS`: exactly one primary).
        alpha: Error rate of the primary and secondary comparisons over all looks.
        guard_alpha: Error rate of each guard comparison (a false guard alarm costs a
            rollback, a safe error).
        min_samples: Sessions per arm before any decision (guard breaches included: the
            intervals are undefined, or uselessly wide, below it).
        max_samples: Sessions per arm after which a candidate without a win is rolled back.
    """

    def __init__(
        self,
        *,
        metrics: Sequence[Metric] = DEFAULT_METRICS,
        alpha: float = 0.05,
        guard_alpha: float = 0.05,
        min_samples: int = 30,
        max_samples: int = 5000,
    ) -> None:
        primaries = [m for m in metrics if m.role == "primary"]
        if len(primaries) != 1:
            raise ConfigError(
                f"exactly one primary metric is needed, got {[m.name for m in primaries]}",
                field="metrics",
            )
        self.metrics = list(metrics)
        self.primary = primaries[0]
        self.tolerances = {m.name: m.tolerance for m in self.metrics}
        """Metric name -> the engine's own tolerance (an experiment may override them)."""
        self.alpha = alpha
        self.guard_alpha = guard_alpha
        self.min_samples = min_samples
        self.max_samples = max_samples

    def check_tolerances(self, tolerances: Mapping[str, float]) -> dict[str, float]:
        """``tolerances`` as an experiment stores them, checked against this engine's metrics.

        Raises:
            ConfigError: A name that is not one of the engine's metrics, or a value that is
                negative or not finite.
        """
        unknown = sorted(set(tolerances) - set(self.tolerances))
        if unknown:
            raise ConfigError(
                f"no metric {', '.join(map(repr, unknown))} to set a tolerance for: the "
                f"engine compares {', '.join(self.tolerances)} (e.g. tokens=0.10 allows +10%)",
                field="tolerances",
            )
        out = {k: float(v) for k, v in tolerances.items()}
        bad = {k: v for k, v in out.items() if not 0 <= v < float("inf")}
        if bad:
            raise ConfigError(
                f"tolerances must be finite and at least 0, got {bad}", field="tolerances"
            )
        return out

    def metrics_for(self, experiment: Experiment) -> list[Metric]:
        """The engine's metrics with ``experiment``'s tolerances applied (names it does not
        know are ignored: another engine started the experiment)."""
        t = experiment.tolerances
        return [replace(m, tolerance=t[m.name]) if m.name in t else m for m in self.metrics]

    def monitor(self, experiment: Experiment) -> Monitor:
        """A fresh incremental monitor for ``experiment``."""
        return Monitor(experiment, self.metrics, self.alpha, self.guard_alpha)

    def decide_outcomes(
        self,
        experiment: Experiment,
        outcomes: Mapping[str, Sequence[Outcome]],
        *,
        now: float | None = None,
    ) -> Decision:
        """Decide from all outcomes so far (builds a fresh :class:`Monitor`)."""
        mon = self.monitor(experiment)
        for arm, rows in outcomes.items():
            mon.add(arm, rows)
        return self.decide(mon, now=now)

    def decide(self, monitor: Monitor, *, now: float | None = None) -> Decision:
        """Apply the rules (module docstring) to the monitor's current intervals.

        Every reason names each metric it cites with that metric's own interval, and an
        interval without enough data behind it as ``not enough data (n=...)``.
        """
        exp = monitor.experiment
        now = time.time() if now is None else now
        n = monitor.n
        metrics = self.metrics_for(exp)
        p = next(m for m in metrics if m.role == "primary")
        ivs = {
            (c.name, m.name): monitor.interval(c.name, m.name)
            for c in exp.candidates
            for m in metrics
        }
        shown = {f"{c}.{m}": iv.describe() for (c, m), iv in ivs.items()}

        def out(
            action: Action, reason: str, arm: str | None = None, to: int | None = None
        ) -> Decision:
            return Decision(
                experiment_id=exp.id,
                action=action,
                reason=reason,
                arm=arm,
                stage=exp.stage,
                to_stage=exp.stage if to is None else to,
                intervals=shown,
                n=n,
                at=now,
            )

        counts = ", ".join(f"{a} {k}" for a, k in n.items())
        short = [a for a, k in n.items() if k < self.min_samples]
        if short:
            return out(
                "hold", f"collecting: fewer than {self.min_samples} sessions in {short} ({counts})"
            )
        for c in exp.candidates:
            for m in metrics:
                iv = ivs[(c.name, m.name)]
                if m.role == "guard" and m.worse(iv):
                    return out(
                        "rollback",
                        f"guard breach on {m.name}: {c.name} {iv.mean_candidate:.3f} vs control "
                        f"{iv.mean_control:.3f}, difference {iv.describe()} above tolerance "
                        f"{m.tolerance_text(iv.mean_control)}",
                        c.name,
                    )
        worse = [c.name for c in exp.candidates if p.worse(ivs[(c.name, p.name)])]
        if len(worse) == len(exp.candidates):
            iv = ivs[(worse[0], p.name)]
            return out(
                "rollback",
                f"{p.name} significantly worse: {worse[0]} {iv.describe()} vs control",
                worse[0],
            )
        waited = now - exp.stage_started_at
        if waited < exp.min_dwell_s:
            return out(
                "hold",
                f"dwell: {exp.min_dwell_s - waited:.0f} s left at stage "
                f"{exp.traffic:.0%} (no breach so far)",
            )
        if not exp.last_partial_stage:
            nxt = exp.stages[exp.stage + 1]
            return out(
                "promote",
                f"stage {exp.traffic:.0%} -> {nxt:.0%}: dwell passed, no guard breach, "
                f"{p.name} not worse ({counts})",
                to=exp.stage + 1,
            )
        best: tuple[float, str] | None = None
        blocked: list[str] = []
        for c in exp.candidates:
            iv = ivs[(c.name, p.name)]
            if not p.better(iv):
                continue
            bad = [
                f"{m.name} worse: {ivs[(c.name, m.name)].describe()} beyond tolerance "
                f"{m.tolerance_text(ivs[(c.name, m.name)].mean_control)}"
                for m in metrics
                if m.role == "secondary" and m.worse(ivs[(c.name, m.name)])
            ]
            if bad:
                blocked.append(f"{c.name} ({'; '.join(bad)}; better on {p.describe(iv)})")
                continue
            low = iv.low if p.higher_is_better else -iv.high
            if best is None or low > best[0]:
                best = (low, c.name)
        if best is not None:
            iv = ivs[(best[1], p.name)]
            return out(
                "promote",
                f"{best[1]} wins on {p.name}: {iv.mean_candidate:.3f} vs control "
                f"{iv.mean_control:.3f}, difference {iv.describe()}; no guard or secondary "
                "breach",
                best[1],
                to=len(exp.stages) - 1,
            )
        if min(n.values()) >= self.max_samples:
            return out(
                "rollback",
                f"no significant win on {p.name} after {min(n.values())} sessions per arm "
                "(futility)" + (f"; blocked: {'; '.join(blocked)}" if blocked else ""),
            )
        if blocked:
            return out("hold", f"blocked: {'; '.join(blocked)}")
        undecided = ", ".join(
            f"{c.name} {ivs[(c.name, p.name)].describe()}" for c in exp.candidates
        )
        return out("hold", f"{p.name} undecided: {undecided}")
