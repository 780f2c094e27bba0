"""``evoharness demo``: the whole loop on the shop environment (SIMULATED offline policy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from evoharness.evolve.demo import Phase, run_demo
from evoharness.sdk.cli import console


def demo(
    train_limit: Annotated[int | None, typer.Option(min=1)] = None,
    val_limit: Annotated[int | None, typer.Option(min=1)] = None,
) -> None:
    """The main job: shop val before, train, one evolve cycle, val after (SIMULATED policy)."""
    result = run_demo(
        train_limit=train_limit,
        val_limit=val_limit,
        on_phase=lambda msg: console.print(f"[dim]{msg}[/dim]"),
    )
    table = Table(title="shop · val · offline policy (SIMULATED)")
    table.add_column("metric")
    for p in result.phases:
        table.add_column(p.label, justify="right")
    rows: list[tuple[str, Callable[[Phase], str]]] = [
        ("success rate", lambda p: f"{p.report.success_rate:.1%}"),
        ("mean score", lambda p: f"{p.report.mean_score:.3f}"),
        ("P0 rate (rule judge)", lambda p: f"{p.p0_rate:.1%}"),
        ("tokens / task", lambda p: f"{p.report.mean_tokens:,.0f}"),
        ("model calls / task", lambda p: f"{p.report.mean_model_calls:.1f}"),
        ("crashed runs", lambda p: str(p.report.errors)),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(p) for p in result.phases))
    kinds = sorted({k for p in result.phases for k in p.report.failure_counts})
    for k in kinds:
        table.add_row(
            f"failure: {k}", *(str(p.report.failure_counts.get(k, 0)) for p in result.phases)
        )
    console.print(table)
    c = result.cycle
    console.print(
        f"evolve cycle on the train traces: {c.episodes} episodes judged "
        f"({c.judge.failed} judge failures); routed {c.routed}; memory "
        f"v{c.memory_version}: {c.strategies} strategies, {c.lessons} lessons; "
        f"guard rules v{c.guard_version}"
    )
    console.print("learned (top entries):")
    strategies = [e for e in result.learned if e.kind == "strategy"][:3]
    lessons = [e for e in result.learned if e.kind == "lesson"][:7]
    for e in [*strategies, *lessons]:
        hint = "; ".join(e.avoid_hints) or e.summary
        console.print(
            f"  {escape(f'[{e.kind}]')} ({e.query_pattern}) {escape(hint)}  "
            f"[dim]conf {e.confidence:.2f}, {len(e.references)} traces[/dim]"
        )
    console.print(
        "The offline policy is a simulator whose mistakes drop when a lesson names the step "
        "it skips. This demonstrates the mechanics of the loop, not gains on real models."
    )
