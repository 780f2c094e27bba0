"""``evoharness report``: one self-contained HTML file about the whole loop."""

from __future__ import annotations

import json
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from evoharness.evolve.cli.options import JudgeEnvOption
from evoharness.harness.errors import ConfigError
from evoharness.sdk.cli import console
from evoharness.sdk.cli.options import HOME, REGISTRY, TRACE_DB, RegistryOption, TraceDbOption
from evoharness.sdk.cli.stores import trace_store

LAYERS = HOME / "layers.json"
"""Where the demo writes its layer results (read when ``--layers`` is not given)."""
LAYERS_FORMAT = (
    '{"rows": [{"layer": "baseline", "split": "val", "success_rate": 0.41}, ...]} (the demo '
    "writes one: evoharness demo)"
)


def report(
    out: Annotated[Path, typer.Option("--out", help="HTML file to write.")] = HOME / "report.html",
    db: TraceDbOption = TRACE_DB,
    registry: RegistryOption = REGISTRY,
    layers: Annotated[
        Path | None,
        typer.Option(help="Layer results JSON (the demo writes .evoharness/layers.json)."),
    ] = LAYERS,
    price_input: Annotated[
        float | None, typer.Option(min=0.0, help="USD per million input tokens (cost plot).")
    ] = None,
    price_output: Annotated[
        float | None, typer.Option(min=0.0, help="USD per million output tokens.")
    ] = None,
    price_cached: Annotated[
        float | None, typer.Option(min=0.0, help="USD per million cached input tokens.")
    ] = None,
    judge_env: JudgeEnvOption = None,
) -> None:
    """Write the HTML report: layers, tokens and cost, cache reuse, interventions,
    rollouts, monitor findings, versions in force."""
    from evoharness.evolve.cli.monitor import spinner
    from evoharness.evolve.report import write_report
    from evoharness.sdk.registry import open_registry

    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; pass the HTML file to write", field="out")
    layer_results = _layer_results(layers)  # a bad file is refused before any work
    prices = {
        k: v
        for k, v in (
            ("input", price_input),
            ("output", price_output),
            ("cached_input", price_cached),
        )
        if v is not None
    }
    with ExitStack() as stack:  # closed also when a section fails to render
        store = stack.enter_context(closing(trace_store(db))) if db.exists() else None
        there = "://" in registry or Path(registry).exists()
        reg = stack.enter_context(open_registry(registry)) if there else None
        with spinner() as progress:
            task = progress.add_task("report", total=None)
            path = write_report(
                out,
                store=store,
                registry=reg,
                layer_results=layer_results,
                prices=prices or None,
                judge=judge_env,
                on_progress=lambda step: progress.update(task, description=step),
            )
    if store is None:
        console.print(f"[dim]no trace store at {escape(str(db))}: run sections left out[/dim]")
    console.print(f"report: {path.resolve()}", markup=False)


def _layer_results(path: Path | None) -> dict[str, Any] | None:
    """The layer results at ``path``, checked: JSON, and rows naming a layer and a split
    with a numeric (or null) success rate. No file at the default path: ``None``."""
    if path is None or (path == LAYERS and not path.exists()):
        return None
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ConfigError(f"--layers {path} {what}; pass a layer results file", field="layers")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"--layers {path} is not JSON ({exc}); write {LAYERS_FORMAT}", field="layers"
        ) from exc
    data = {"rows": data} if isinstance(data, list) else data
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ConfigError(
            f"--layers {path} has no list of rows; write {LAYERS_FORMAT}", field="layers"
        )
    for i, row in enumerate(rows):
        rate = row.get("success_rate") if isinstance(row, dict) else None
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("layer"), str)
            or not isinstance(row.get("split", "val"), str)
            or not (rate is None or (isinstance(rate, int | float) and not isinstance(rate, bool)))
        ):
            raise ConfigError(
                f"--layers {path}: row {i} is {json.dumps(row)[:80]}, not a layer result; "
                f"write {LAYERS_FORMAT}",
                field="layers",
            )
    return data
