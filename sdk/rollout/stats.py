"""Always-valid comparison of two arms: an anytime-valid confidence sequence for a difference.

The statistics come from ``savvi`` (Safe Anytime Valid Inference): its ``LinearRegression``
implements the anytime-valid t-test of Lindon, Ham, Tingley & Bojinov, *Anytime-Valid Linear
Models and Regression Adjusted Causal Inference in Randomized Experiments* (2024). We fit
``y = b0 + b1 * candidate`` by recursive least squares; ``b1`` is the difference of the arm
means and savvi gives a confidence *sequence* for it: with probability at least ``1 - alpha``
the interval covers the true difference at every sample size simultaneously. The engine may
therefore look after every batch and stop whenever the interval excludes zero without
inflating the false-promotion rate (a fixed-horizon test peeked at after every batch does
inflate it; ``evoharness bench rollout`` measures both). The method works for any metric with
finite variance (success rates, token counts, latencies) and for unequal arm sizes.

Why savvi and not the others (see ``docs/prompts.md``): ``confseq`` ships only as a C++ source
distribution that needs Boost to build; ``gbstats`` pins ``numpy<2`` and ``pandas<2``;
``spotify-confidence`` pulls a notebook stack and its sequential tests need a fixed maximum
sample size; ``expectation`` needs Python 3.12.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from evoharness.harness import require_extra


@dataclass(frozen=True)
class Interval:
    """A confidence-sequence interval for ``candidate - control`` at the current sample size.

    Attributes:
        estimate: The difference of the arm means.
        low: Lower bound (``-inf`` while there is too little data).
        high: Upper bound (``+inf`` while there is too little data).
        n_control: Samples in the control arm.
        n_candidate: Samples in the candidate arm.
        mean_control: Control mean.
        mean_candidate: Candidate mean.
        constant: Every session of both arms had the same value (no interval can be drawn
            from data without variation, however much there is).
    """

    estimate: float
    low: float
    high: float
    n_control: int
    n_candidate: int
    mean_control: float
    mean_candidate: float
    constant: bool = False

    @property
    def significant(self) -> bool:
        """The interval excludes zero."""
        return self.low > 0 or self.high < 0

    @property
    def bounded(self) -> bool:
        """Both bounds are finite (there was enough data for an interval)."""
        return math.isfinite(self.low) and math.isfinite(self.high)

    def describe(self, digits: int = 3) -> str:
        """``+0.081 [0.012, 0.150]``; without an interval, why: ``not enough data (n=3
        control, 2 candidate)`` (after the estimate once both arms have a session), or
        ``+0.000, no variation: every session 0 (n=...)``."""
        est = f"{self.estimate:+.{digits}f}"
        if self.bounded:
            return f"{est} [{self.low:.{digits}f}, {self.high:.{digits}f}]"
        n = f"n={self.n_control} control, {self.n_candidate} candidate"
        if not (self.n_control and self.n_candidate):
            return f"not enough data ({n})"
        if self.constant:
            return f"{est}, no variation: every session {self.mean_control:g} ({n})"
        return f"{est}, not enough data ({n})"


class SequentialComparison:
    """Stream values into two arms; ask for the always-valid interval after any batch.

    Args:
        alpha: Type I error over the whole (unbounded) sequence of looks.
        phi: savvi's prior scale on the standardised effect (1.0, savvi's default, favours
            effects around one standard deviation; smaller values suit smaller effects).

    Example:
        >>> c = SequentialComparison(alpha=0.05)
        >>> c.add(False, [0.0, 1.0] * 200)
        >>> c.add(True, [1.0] * 400)
        >>> c.interval().low > 0
        True
    """

    def __init__(self, *, alpha: float = 0.05, phi: float = 1.0) -> None:
        savvi_lr = require_extra(
            "savvi.linear_regression", extra="rollout", feature="Rollout statistics"
        )
        self.alpha = alpha
        self._model: Any = savvi_lr.LinearRegression(alpha, 2, phi=phi)
        self._np: Any = require_extra("numpy", extra="rollout", feature="Rollout statistics")
        self._n = [0, 0]
        self._sum = [0.0, 0.0]
        self._range = (math.inf, -math.inf)  # smallest and largest value seen, both arms

    def add(self, candidate: bool, values: Iterable[float]) -> None:
        """Append observations of one arm (``candidate=False``: the control)."""
        np = self._np
        arm = 1 if candidate else 0
        row = np.array([0.0, 1.0, float(arm)])
        for v in values:
            row[0] = float(v)
            self._model.update(row)
            self._n[arm] += 1
            self._sum[arm] += float(v)
            self._range = (min(self._range[0], float(v)), max(self._range[1], float(v)))

    def interval(self, *, running: bool = True) -> Interval:
        """Update and return the confidence sequence for ``candidate - control``.

        The bounds are the running intersection over every call so far (savvi keeps the
        tightest bounds seen), which is still valid because the sequence covers uniformly.

        With ``running=False`` they are this look's alone, centred on the estimate: as valid
        at every sample size, and what a stream whose difference moves over time (a drift
        monitor's) needs: the intersection keeps bounds from looks at which the difference
        was smaller and can then exclude the current estimate.
        """
        np = self._np
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if min(self._n) >= 2:
                self._model.infer()
            bounds = self._model.conf_int
            if not running and min(self._n) >= 2:
                bounds = self._model.calculate_conf_int()
        low, high = (float(x) for x in bounds[1])
        n0, n1 = self._n
        m0 = self._sum[0] / n0 if n0 else 0.0
        m1 = self._sum[1] / n1 if n1 else 0.0
        if math.isnan(low) or math.isnan(high):  # no variation yet (a look's own bounds)
            low, high = -math.inf, math.inf
        return Interval(
            m1 - m0, low, high, n0, n1, m0, m1, constant=self._range[0] == self._range[1]
        )


def fixed_horizon_n(p_control: float, p_candidate: float, *, alpha: float, power: float) -> int:
    """Per-arm sample size of a two-sided two-proportion z-test (the classical baseline)."""
    from statistics import NormalDist

    z = NormalDist()
    za, zb = z.inv_cdf(1 - alpha / 2), z.inv_cdf(power)
    var = p_control * (1 - p_control) + p_candidate * (1 - p_candidate)
    return math.ceil((za + zb) ** 2 * var / (p_candidate - p_control) ** 2)
