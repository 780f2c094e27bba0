"""Sequential drift detection: a reference window against everything that came after it.

A :class:`DriftDetector` keeps the first ``reference`` values of a stream as the reference and
compares every later value against it with :class:`~evoharness.sdk.rollout.SequentialComparison`
(savvi's anytime-valid confidence sequence for a difference of means). It looks after every
batch; because the interval is valid at every sample size at once, looking after each batch
does not inflate false alarms the way a fixed-horizon test peeked at repeatedly does
(``evoharness bench monitor`` measures both).

One comparison that starts right after the reference dilutes a late drop: after 500 stable
samples and 50 bad ones the "later" mean has barely moved. The detector therefore also starts
a fresh comparison every ``restart_every`` later samples (each still against the same
reference). Comparison ``j`` runs at ``alpha * 6 / (pi**2 * j**2)``; these sum to ``alpha``, so
by the union bound the chance of any false alarm over all comparisons and all looks stays below
``alpha``. A fixed threshold ("alarm below 0.7") is what this replaces: it needs tuning per
metric and fires on noise as often as the stream crosses it.

Each look uses that look's interval, centred on its estimate (not the running intersection
of every look, whose bounds come from earlier looks at which a drifting difference was
smaller, and which then excludes the estimate it is printed with). A shift must also clear a
minimum effect (``min_effect``) to raise an alarm: a significant shift of a few milliseconds
on a busy machine is real and not worth anyone's time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from evoharness.harness import ConfigError
from evoharness.sdk.rollout.stats import Interval, SequentialComparison

Direction = Literal["decrease", "increase"]


@dataclass(frozen=True)
class Detection:
    """A significant shift, as first seen.

    Attributes:
        index: Position in the stream (0-based, counting the reference) of the last value
            of the batch at which the shift was first significant.
        started_at: Position of the first value of the comparison that fired.
        interval: The confidence-sequence interval for ``later - reference`` at that look.
        alpha: The comparison's share of the overall error rate.
    """

    index: int
    started_at: int
    interval: Interval
    alpha: float


@dataclass
class _Arm:
    start: int
    alpha: float
    cmp: SequentialComparison


@dataclass
class DriftDetector:
    """Detects a shift of a stream's mean away from its reference window.

    Args:
        reference: Values that form the reference (the stream's first ones).
        batch: Look after every this many later values.
        alpha: Chance of any false alarm over the whole, unbounded stream.
        direction: ``decrease`` (scores, success rates) or ``increase`` (P0 rates,
            latencies) counts as degradation.
        min_effect: Smallest shift worth an alarm (the interval must clear it), in the
            metric's units, or a function of the reference mean that gives it (a floor
            relative to the reference); 0 alarms on any significant shift.
        restart_every: Start a new comparison every this many later values (``None``: one
            comparison only).
        max_arms: At most this many comparisons run at once (the oldest ones stop).
        phi: savvi's prior scale on the standardised effect.

    Example:
        >>> d = DriftDetector(reference=40, batch=10)
        >>> d.update([0.8, 0.9] * 20 + [0.3, 0.4] * 20) is not None
        True
    """

    reference: int = 50
    batch: int = 10
    alpha: float = 0.05
    direction: Direction = "decrease"
    min_effect: float | Callable[[float], float] = 0.0
    restart_every: int | None = 100
    max_arms: int = 8
    phi: float = 1.0
    seen: int = 0
    detection: Detection | None = None
    _ref: list[float] = field(default_factory=list)
    _arms: list[_Arm] = field(default_factory=list)
    _pending: list[float] = field(default_factory=list)
    _opened: int = 0

    def __post_init__(self) -> None:
        if self.reference < 2 or self.batch < 1:
            raise ConfigError("reference must be >= 2 and batch >= 1", field="reference")
        if not 0 < self.alpha < 1:
            raise ConfigError("alpha must be in (0, 1)", field="alpha")
        if self.direction not in ("decrease", "increase"):
            raise ConfigError("direction must be 'decrease' or 'increase'", field="direction")

    def _open(self, start: int) -> None:
        self._opened += 1
        share = self.alpha * 6 / (math.pi**2 * self._opened**2)
        cmp = SequentialComparison(alpha=share, phi=self.phi)
        cmp.add(False, self._ref)
        self._arms.append(_Arm(start, share, cmp))
        if len(self._arms) > self.max_arms:
            self._arms.pop(0)

    def floor(self) -> float:
        """The smallest shift worth an alarm now (``min_effect`` at the reference mean)."""
        if callable(self.min_effect):
            reference = self.reference_mean
            return 0.0 if reference is None else max(0.0, self.min_effect(reference))
        return self.min_effect

    def _degraded(self, iv: Interval) -> bool:
        if self.direction == "decrease":
            return iv.high < -self.floor()
        return iv.low > self.floor()

    def _look(self) -> Detection | None:
        for arm in self._arms:
            iv = arm.cmp.interval(running=False)
            if self._degraded(iv):
                return Detection(self.seen - 1, arm.start, iv, arm.alpha)
        return None

    def update(self, values: Iterable[float]) -> Detection | None:
        """Feed values in stream order; returns the detection once there is one (and keeps
        returning it)."""
        for v in values:
            if self.detection is not None:
                return self.detection
            x = float(v)
            if not math.isfinite(x):
                continue
            if len(self._ref) < self.reference:
                self._ref.append(x)
                self.seen += 1
                continue
            later = self.seen - self.reference
            if later == 0 or (self.restart_every and later % self.restart_every == 0):
                self._open(self.seen)
            for arm in self._arms:
                arm.cmp.add(True, [x])
            self.seen += 1
            self._pending.append(x)
            if len(self._pending) >= self.batch:
                self._pending.clear()
                self.detection = self._look()
        return self.detection

    @property
    def reference_mean(self) -> float | None:
        """Mean of the reference window (``None`` until it is full)."""
        if len(self._ref) < self.reference:
            return None
        return sum(self._ref) / len(self._ref)


def detect(values: Iterable[float], **options: Any) -> Detection | None:
    """Run a :class:`DriftDetector` (``options``: its fields) over a whole stream."""
    return DriftDetector(**options).update(values)
