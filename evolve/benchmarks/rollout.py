"""``evoharness bench rollout``: sequential decisions vs. a peeked fixed-horizon test.

Simulated experiments with known true success rates (Bernoulli sessions), looked at after
every batch of ``batch`` sessions per arm, up to ``max_n`` sessions per arm:

(a) A/A (both arms at ``p_control``) over ``seeds`` seeds: how often does the rollout engine's
    test (:class:`~evoharness.sdk.rollout.SequentialComparison`, an always-valid confidence
    sequence) promote a candidate that is no better? That is the false-promotion rate.
(b) ``p_control`` vs ``p_candidate`` (default 0.45 vs 0.55) over ``power_seeds`` seeds: how
    often does it promote (power), and after how many sessions per arm (mean samples to a
    decision, undecided runs counted at ``max_n``)?
(c) The same data streams through the naive alternative: a fixed-horizon two-proportion
    z-test at the same alpha, peeked at after every batch.

``samples_ratio`` is the mean samples per arm to a decision in (b) divided by the per-arm
sample size a fixed-horizon test needs for the same alpha and power. The last line is
``false_promotion=… power=… samples_ratio=… naive_false_promotion=…``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist, fmean
from typing import Any

from rich.progress import Progress

from evoharness.sdk.rollout import SequentialComparison, fixed_horizon_n

Echo = Callable[..., None]


@dataclass(frozen=True)
class RunResult:
    """One simulated experiment: what each test concluded and after how many samples."""

    sequential: str  # promote | rollback | undecided
    sequential_n: int
    naive: str
    naive_n: int


def _z_promotes(s0: int, s1: int, n: int, z_crit: float) -> int:
    """+1 when the pooled two-proportion z-test says candidate > control, -1 when <, else 0."""
    pooled = (s0 + s1) / (2 * n)
    se = math.sqrt(max(pooled * (1 - pooled) * 2 / n, 1e-12))
    z = (s1 / n - s0 / n) / se
    return 1 if z > z_crit else (-1 if z < -z_crit else 0)


def simulate(
    p_control: float,
    p_candidate: float,
    seed: int,
    *,
    batch: int,
    max_n: int,
    alpha: float,
) -> RunResult:
    """Run one experiment, looking after every batch with both tests on the same data."""
    rng = random.Random(seed)
    seq = SequentialComparison(alpha=alpha)
    z_crit = NormalDist().inv_cdf(1 - alpha / 2)
    s0 = s1 = n = 0
    sequential: tuple[str, int] | None = None
    naive: tuple[str, int] | None = None
    while n < max_n and (sequential is None or naive is None):
        a = [float(rng.random() < p_control) for _ in range(batch)]
        b = [float(rng.random() < p_candidate) for _ in range(batch)]
        n += batch
        s0 += int(sum(a))
        s1 += int(sum(b))
        if sequential is None:
            seq.add(False, a)
            seq.add(True, b)
            iv = seq.interval()
            if iv.low > 0:
                sequential = ("promote", n)
            elif iv.high < 0:
                sequential = ("rollback", n)
        if naive is None:
            verdict = _z_promotes(s0, s1, n, z_crit)
            if verdict:
                naive = ("promote" if verdict > 0 else "rollback", n)
    sequential = sequential or ("undecided", max_n)
    naive = naive or ("undecided", max_n)
    return RunResult(sequential[0], sequential[1], naive[0], naive[1])


def run(
    *,
    seeds: int = 300,
    power_seeds: int = 200,
    batch: int = 50,
    max_n: int = 2000,
    p_control: float = 0.45,
    p_candidate: float = 0.55,
    alpha: float = 0.05,
    power: float = 0.8,
    quick: bool = False,
    echo: Echo = print,
) -> dict[str, Any]:
    """Run the benchmark; print a summary and the machine-readable last line.

    Args:
        seeds: A/A experiments.
        power_seeds: Experiments with a true difference.
        batch: Sessions per arm between two looks.
        max_n: Sessions per arm after which an experiment stops undecided.
        p_control: True success rate of the control (and of both arms in A/A).
        p_candidate: True success rate of the better candidate.
        alpha: Significance level of both tests.
        power: Target power for the fixed-horizon sample size.
        quick: A small run for tests (20 seeds each, at most 1200 sessions per arm).
        echo: Where lines go.

    Returns:
        The numbers of the last line plus details.
    """
    if quick:
        seeds, power_seeds, max_n = 20, 20, min(max_n, 1200)
    aa: list[RunResult] = []
    ab: list[RunResult] = []
    with Progress(transient=True) as progress:
        t_aa = progress.add_task("A/A experiments", total=seeds)
        for s in range(seeds):
            aa.append(simulate(p_control, p_control, s, batch=batch, max_n=max_n, alpha=alpha))
            progress.advance(t_aa)
        t_ab = progress.add_task("A/B experiments", total=power_seeds)
        for s in range(power_seeds):
            ab.append(
                simulate(p_control, p_candidate, 10_000 + s, batch=batch, max_n=max_n, alpha=alpha)
            )
            progress.advance(t_ab)
    fixed_n = fixed_horizon_n(p_control, p_candidate, alpha=alpha, power=power)
    false_promotion = sum(r.sequential == "promote" for r in aa) / len(aa)
    naive_false = sum(r.naive == "promote" for r in aa) / len(aa)
    powered = sum(r.sequential == "promote" for r in ab) / len(ab)
    mean_n = fmean(r.sequential_n for r in ab)
    naive_power = sum(r.naive == "promote" for r in ab) / len(ab)
    looks = max_n // batch
    echo(
        f"rollout decisions, looking every {batch} sessions per arm (up to {looks} looks, "
        f"{max_n} per arm), alpha={alpha} (simulated Bernoulli sessions)"
    )
    echo(
        f"  A/A {p_control:.2f} vs {p_control:.2f}, {len(aa)} seeds: sequential false promotion "
        f"{false_promotion:.3f}; naive peeked z-test {naive_false:.3f}"
    )
    echo(
        f"  A/B {p_control:.2f} vs {p_candidate:.2f}, {len(ab)} seeds: sequential power "
        f"{powered:.3f}, mean {mean_n:.0f} sessions per arm to a decision; naive power "
        f"{naive_power:.3f}"
    )
    echo(f"  fixed-horizon test for alpha={alpha}, power={power}: {fixed_n} sessions per arm")
    result = {
        "false_promotion": round(false_promotion, 4),
        "power": round(powered, 4),
        "samples_ratio": round(mean_n / fixed_n, 3),
        "naive_false_promotion": round(naive_false, 4),
        "mean_samples": round(mean_n, 1),
        "fixed_horizon_n": fixed_n,
        "seeds": len(aa),
        "power_seeds": len(ab),
        "looks": looks,
    }
    keys = ("false_promotion", "power", "samples_ratio", "naive_false_promotion")
    echo(" ".join(f"{k}={result[k]}" for k in keys))
    return result
