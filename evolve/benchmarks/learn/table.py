"""The chain's verdicts and report: P0 failures, the per-layer table and the last line."""

from __future__ import annotations

from collections.abc import Sequence

from evoharness.evolve.benchmarks.bfcl import Layer, layer_row
from evoharness.evolve.benchmarks.learn.settings import LAST_KEYS, OPTIONAL_KEYS
from evoharness.sdk.runner import TaskResult


def p0_failed(r: TaskResult) -> bool:
    """A P0 failure: a crashed run, a call of a function not offered (BFCL), a fabricated
    item (shop)."""
    return (
        r.error is not None
        or r.components.get("p0_pass", 1.0) == 0.0
        or r.components.get("fabricated_items", 0.0) > 0
    )


def new_p0(candidate: Sequence[TaskResult], control: Sequence[TaskResult]) -> int:
    """Guard tasks the control passed P0 on and the candidate fails."""
    return sum(p0_failed(a) and not p0_failed(b) for a, b in zip(candidate, control, strict=True))


def learn_table(layers: Sequence[Layer]) -> list[str]:
    """Per layer: test success with its 95% interval, tasks won/lost against the previous
    layer and the paired p-value, P0 failures on test, guard success and new P0, mean tokens
    per test task, time, kept."""
    lines = [
        "  layer    test success (95% CI)       won/lost  p vs prev  P0 test  guard   new P0"
        "  tokens   time  kept"
    ]
    for i, layer in enumerate(layers):
        r = layer_row(layers, i)
        p0 = sum(p0_failed(x) for x in layer.test)
        lines.append(
            f"  {layer.name:<8} {r.k:>3}/{r.n:<3} {r.k / max(r.n, 1):.3f} [{r.lo:.2f}, {r.hi:.2f}]"
            f"  {r.moved:>9}  {r.p:>9}  {p0:>7}  {r.guard:>3}/{len(layer.guard):<3} "
            f"{layer.new_p0:>6}  {r.tokens:>6.0f}  {layer.seconds:>5.0f}s  "
            f"{'yes' if layer.kept else 'no'}"
        )
    return lines


def last_line(layers: Sequence[Layer], test_tasks: int) -> tuple[str, dict[str, float]]:
    """The machine-readable last line and its values: the fixed fields, then ``grpo=…
    p_grpo=…`` when that layer ran."""
    by = {x.name: x for x in layers}
    out: dict[str, float] = {k: by[k].rate() for k in LAST_KEYS}
    out["test_tasks"] = float(test_tasks)
    for k in LAST_KEYS[1:]:
        p = by[k].p_value
        out[f"p_{k}"] = 1.0 if p is None else p
    out["p0_regressions"] = float(sum(x.new_p0 for x in layers))
    for k in OPTIONAL_KEYS:
        if k in by:
            p = by[k].p_value
            out[k] = by[k].rate()
            out[f"p_{k}"] = 1.0 if p is None else p
    cells = []
    for k, v in out.items():
        if k in ("test_tasks", "p0_regressions"):
            cells.append(f"{k}={int(v)}")
        elif k.startswith("p_"):
            cells.append(f"{k}={v:.2g}")
        else:
            cells.append(f"{k}={v:.3f}")
    return " ".join(cells), out
