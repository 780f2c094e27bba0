"""``evoharness bench monitor``: how fast the monitor sees a quality drop, and how often it
cries wolf.

Score streams stand in for a rubric total per run (SIMULATED: clipped normal scores, mean
0.8, sd 0.15, fixed seeds). Each drop stream is stable for ``change_at`` runs and then drops by
``size``; each stable stream never changes. The monitor's :class:`DriftDetector` (reference
window vs. later runs, savvi's always-valid confidence sequence, a look after every batch)
runs on every stream. The baseline, in the same run, is the usual shortcut: a one-sided
z-test of the same reference against all later runs, also looked at after every batch. Its
per-look error rate is the same 5 %, but peeking makes its false alarms pile up.

Detection delay counts runs from the first dropped one to the end of the batch at which the
alarm fired. Last line: ``detection_delay=<median over all detected drops> ...
false_alarms=<stable streams with an alarm> ...``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from statistics import NormalDist

from rich.progress import Progress

from evoharness.evolve.monitor.sequential import DriftDetector

SIZES = (0.05, 0.1, 0.2, 0.3)


def stream(seed: int, *, length: int, change_at: int | None, size: float) -> list[float]:
    """One simulated score stream (a drop of ``size`` from ``change_at`` on, if given)."""
    rng = random.Random(seed)
    out = []
    for i in range(length):
        mean = 0.8 - (size if change_at is not None and i >= change_at else 0.0)
        out.append(min(1.0, max(0.0, rng.gauss(mean, 0.15))))
    return out


def sequential_alarm(values: Sequence[float], *, reference: int, batch: int) -> int | None:
    """Index at which the monitor's detector fires (``None``: never)."""
    d = DriftDetector(reference=reference, batch=batch, alpha=0.05, restart_every=50)
    hit = d.update(values)
    return None if hit is None else hit.index


def peeked_z_alarm(
    values: Sequence[float], *, reference: int, batch: int, alpha: float = 0.05
) -> int | None:
    """Index at which a one-sided fixed-horizon z-test, peeked after every batch, fires."""
    ref = values[:reference]
    m0, v0 = statistics.fmean(ref), statistics.variance(ref)
    z_crit = NormalDist().inv_cdf(1 - alpha)
    later: list[float] = []
    for i in range(reference, len(values)):
        later.append(values[i])
        if len(later) % batch or len(later) < 2:
            continue
        m1, v1 = statistics.fmean(later), statistics.variance(later)
        se = math.sqrt(v0 / reference + v1 / len(later)) or 1e-9
        if (m0 - m1) / se > z_crit:
            return i
    return None


def _median(xs: Sequence[int]) -> str:
    return f"{statistics.median(xs):.0f}" if xs else "na"


def run(
    *,
    seeds: int = 20,
    stable_seeds: int = 40,
    reference: int = 100,
    change_at: int = 200,
    length: int = 600,
    batch: int = 10,
    echo: Callable[[str], None] = print,
) -> dict[str, float | int]:
    """Run the benchmark and print a table plus the machine-readable last line."""
    echo(
        f"SIMULATED score streams: mean 0.8, sd 0.15, reference {reference} runs, drop at run "
        f"{change_at}, {length} runs; {seeds} seeds per drop size, {stable_seeds} stable streams"
    )
    delays: dict[float, list[int]] = {s: [] for s in SIZES}
    base_delays: dict[float, list[int]] = {s: [] for s in SIZES}
    early = base_early = 0
    false_alarms = base_false = 0
    total = seeds * len(SIZES) + stable_seeds
    with Progress(transient=True) as progress:
        task = progress.add_task("bench monitor", total=total)
        for size in SIZES:
            for seed in range(seeds):
                xs = stream(seed, length=length, change_at=change_at, size=size)
                for alarm, bucket, is_base in (
                    (sequential_alarm(xs, reference=reference, batch=batch), delays, False),
                    (peeked_z_alarm(xs, reference=reference, batch=batch), base_delays, True),
                ):
                    if alarm is None:
                        continue
                    if alarm < change_at:
                        base_early += is_base
                        early += not is_base
                    else:
                        bucket[size].append(alarm - change_at + 1)
                progress.advance(task)
        for seed in range(stable_seeds):
            xs = stream(10_000 + seed, length=length, change_at=None, size=0.0)
            false_alarms += sequential_alarm(xs, reference=reference, batch=batch) is not None
            base_false += peeked_z_alarm(xs, reference=reference, batch=batch) is not None
            progress.advance(task)
    echo(f"{'drop':>6} {'detected':>9} {'median delay':>13} {'baseline det.':>14} {'delay':>6}")
    for size in SIZES:
        echo(
            f"{size:>6.2f} {len(delays[size]):>4}/{seeds:<4} {_median(delays[size]):>13} "
            f"{len(base_delays[size]):>9}/{seeds:<4} {_median(base_delays[size]):>6}"
        )
    echo(
        f"stable streams with an alarm: monitor {false_alarms}/{stable_seeds}, "
        f"peeked z-test {base_false}/{stable_seeds}; alarms before the drop: monitor {early}, "
        f"z-test {base_early}"
    )
    all_delays = [d for s in SIZES for d in delays[s]]
    base_all = [d for s in SIZES for d in base_delays[s]]
    detected = len(all_delays)
    by_size = ",".join(f"{s}:{_median(delays[s])}" for s in SIZES)
    echo(
        f"detection_delay={_median(all_delays)} false_alarms={false_alarms} "
        f"detected={detected}/{seeds * len(SIZES)} delay_by_drop={by_size} "
        f"early_alarms={early} baseline_detection_delay={_median(base_all)} "
        f"baseline_false_alarms={base_false} baseline_early_alarms={base_early} "
        f"stable_streams={stable_seeds}"
    )
    return {
        "detection_delay": statistics.median(all_delays) if all_delays else math.nan,
        "false_alarms": false_alarms,
        "baseline_false_alarms": base_false,
        "detected": detected,
    }
