"""``evoharness report``: one self-contained HTML file about the whole loop."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from evoharness.evolve.cli.options import JudgeEnvOption
from evoharness.evolve.report import load_layer_results, write_report
from evoharness.harness.tracing import TraceStore
from evoharness.sdk.cli import console
from evoharness.sdk.cli.options import HOME, REGISTRY, TRACE_DB, RegistryOption, TraceDbOption
from evoharness.sdk.registry import open_registry


def report(
    out: Annotated[Path, typer.Option("--out", help="HTML file to write.")] = HOME / "report.html",
    db: TraceDbOption = TRACE_DB,
    registry: RegistryOption = REGISTRY,
    layers: Annotated[
        Path | None,
        typer.Option(help="Layer results JSON (the demo writes .evoharness/layers.json)."),
    ] = HOME / "layers.json",
    price_input: Annotated[
        float | None, typer.Option(help="USD per million input tokens (cost plot).")
    ] = None,
    price_output: Annotated[
        float | None, typer.Option(help="USD per million output tokens.")
    ] = None,
    price_cached: Annotated[
        float | None, typer.Option(help="USD per million cached input tokens.")
    ] = None,
    judge_env: JudgeEnvOption = None,
) -> None:
    """Write the HTML report: layers, tokens and cost, cache reuse, interventions,
    rollouts, monitor findings, versions in force."""
    store = TraceStore(db) if db.exists() else None
    reg = open_registry(registry) if ("://" in registry or Path(registry).exists()) else None
    prices = {
        k: v
        for k, v in (
            ("input", price_input),
            ("output", price_output),
            ("cached_input", price_cached),
        )
        if v is not None
    }
    try:  # closed also when a section fails to render
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("report", total=None)
            path = write_report(
                out,
                store=store,
                registry=reg,
                layer_results=load_layer_results(layers),
                prices=prices or None,
                judge=judge_env,
                on_progress=lambda step: progress.update(task, description=step),
            )
    finally:
        if store is not None:
            store.close()
        if reg is not None:
            reg.close()
    if store is None:
        console.print(f"[dim]no trace store at {db}: run sections left out[/dim]")
    console.print(f"report: {path.resolve()}")
