"""DPO pairs from the model's own samples of the same task: verified good vs failed.

:func:`self_pairs` groups :class:`~evoharness.evolve.weights.sampling.Sample` runs by task and
pairs the verified runs with the failed runs of that task at the first assistant turn where
they part (:func:`~evoharness.evolve.weights.datasets.divergence`); a task with no good or no
bad sample gives no pair. :func:`dpo_rows` gives them as TRL rows for
:func:`~evoharness.evolve.weights.training.train` with a
:class:`~evoharness.evolve.weights.config.DPORunConfig` (often on top of the rejection-sampled
SFT adapter: ``init_adapter``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from evoharness.evolve.weights.datasets import divergence
from evoharness.evolve.weights.rows import DPORow
from evoharness.evolve.weights.sampling import Sample
from evoharness.sdk.registry.base import content_hash


def _pairings(good: Sequence[Sample], bad: Sequence[Sample]) -> Iterator[tuple[Sample, Sample]]:
    """Every (good, bad) pair once, round robin: each bad run meets a different good run
    before any good run is paired twice (so a cap keeps the pairs varied)."""
    for offset in range(len(good)):
        for i, b in enumerate(bad):
            yield good[(i + offset) % len(good)], b


def self_pairs(samples: Sequence[Sample], *, max_per_task: int = 4) -> list[DPORow]:
    """Preference rows from same-task good/bad samples, distinct, at most ``max_per_task`` a
    task. ``chosen_trace_id``/``rejected_trace_id`` are the samples' :attr:`~Sample.ref`; a
    pair whose runs do not part at an assistant turn (only a tool answered differently) is
    skipped."""
    by_task: dict[str, list[Sample]] = {}
    for s in samples:
        by_task.setdefault(s.task, []).append(s)
    rows: list[DPORow] = []
    for task, runs in by_task.items():
        good = [s for s in runs if s.verified]
        bad = [s for s in runs if not s.verified]
        seen: set[str] = set()
        for g, b in _pairings(good, bad):
            if len(seen) >= max_per_task:
                break
            parted = divergence(g.messages, b.messages)
            if parted is None:
                continue
            prefix, chosen, rejected = parted
            key = content_hash([prefix, chosen, rejected])  # two bad runs may say the same
            if key in seen:
                continue
            seen.add(key)
            rows.append(
                DPORow(
                    prompt=prefix,
                    chosen=[chosen],
                    rejected=[rejected],
                    tools=g.tools,
                    task=task,
                    chosen_trace_id=g.ref,
                    rejected_trace_id=b.ref,
                )
            )
    return rows


def dpo_rows(samples: Sequence[Sample], *, max_per_task: int = 4) -> list[dict[str, Any]]:
    """:func:`self_pairs` as TRL preference rows (with the ``task`` column, as
    :func:`~evoharness.evolve.weights.datasets.build_dpo` writes them)."""
    return [r.trl() | {"task": r.task} for r in self_pairs(samples, max_per_task=max_per_task)]
