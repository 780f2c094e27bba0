"""``evoharness run``: run an environment's split through ``create_agent`` and print a table."""

from __future__ import annotations

import re
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from evoharness.harness.errors import ConfigError
from evoharness.sdk.cli.console import console, progress_bar
from evoharness.sdk.cli.error_line import wants_traceback
from evoharness.sdk.cli.options import (
    TRACE_DB,
    ApiKeyEnvOption,
    BaseUrlOption,
    ConcurrencyOption,
    EnvOption,
    TaskLimitOption,
    TracebackOption,
    TraceDbOption,
)

if TYPE_CHECKING:  # imported where they run: --help and argument errors need none of them
    from rich.table import Table

    from evoharness.sdk.runner import RunReport, TaskResult


def file_safe(name: str) -> str:
    """``name`` as a piece of a file name: ``pkg.plugin:environment`` -> ``pkg.plugin-environment``
    (a colon is a drive on Windows, a stream on NTFS and a path separator to scp and rsync)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"


def results_table(title: str, reports: dict[str, RunReport]) -> Table:
    """A rich table with one column per labelled report."""
    from rich.table import Table

    table = Table(title=escape(title))
    table.add_column("metric")
    for label in reports:
        table.add_column(label, justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("tasks", [str(r.tasks) for r in reports.values()]),
        ("success rate", [f"{r.success_rate:.1%}" for r in reports.values()]),
        ("mean score", [f"{r.mean_score:.3f}" for r in reports.values()]),
        ("model calls / task", [f"{r.mean_model_calls:.1f}" for r in reports.values()]),
        ("tool calls / task", [f"{r.mean_tool_calls:.1f}" for r in reports.values()]),
        ("tokens / task", [f"{r.mean_tokens:,.0f}" for r in reports.values()]),
        ("crashed runs", [str(r.errors) for r in reports.values()]),
    ]
    kinds = sorted({k for r in reports.values() for k in r.failure_counts})
    rows += [
        (f"failure: {k}", [str(r.failure_counts.get(k, 0)) for r in reports.values()])
        for k in kinds
    ]
    events = sorted({k for r in reports.values() for k in r.event_counts})
    rows += [
        (f"harness: {k}", [str(r.event_counts.get(k, 0)) for r in reports.values()]) for k in events
    ]
    for name, cells in rows:
        table.add_row(escape(name), *cells)
    return table


def execute_run(
    *,
    env_name: str,
    split: str,
    model: str,
    base_url: str | None,
    api_key_env: str | None,
    concurrency: int,
    limit: int | None,
    faults: str,
    harness: bool,
    out: Path | None,
    label: str,
    trace_db: Path | None = None,
    context: bool = False,
    timeout_s: float | None = None,
    max_retries: int | None = None,
    task_deadline_s: float | None = None,
    check_endpoint: bool = True,
) -> tuple[RunReport, list[TaskResult]]:
    """Run one split with a progress bar; returns the report and per-task results.

    With ``check_endpoint`` an unreachable model endpoint raises
    :class:`~evoharness.sdk.models.EndpointUnreachableError` before any task starts.
    """
    import asyncio
    import os

    from evoharness.harness.tracing import Tracer, TraceStore
    from evoharness.sdk.environment import load_environment
    from evoharness.sdk.models import model_factory
    from evoharness.sdk.models import preflight as check_model_endpoint
    from evoharness.sdk.runner import RunReport, run_tasks, write_results

    options: dict[str, object] = {"faults": faults}
    if context:
        options["context"] = True
    with console.status(f"loading environment {env_name}"):  # imports take seconds
        env = load_environment(env_name, **options)
        try:
            tasks = list(env.tasks(split))[:limit] if limit else list(env.tasks(split))
        except ConfigError as exc:  # the environment's own words: say which option it was
            raise ConfigError(f"--split {split!r}: {exc}", field="split") from exc
        factory = model_factory(
            model,
            env,
            base_url=base_url,
            api_key_env=api_key_env,
            timeout_s=timeout_s,
            max_retries=max_retries,
        )
    if check_endpoint:
        with console.status(f"checking the endpoint of {model}"):
            check_model_endpoint(model, base_url=base_url, timeout_s=min(timeout_s or 10.0, 10.0))
    middleware = env.harness_middleware if harness else None
    store = TraceStore(trace_db) if trace_db is not None else None
    exporter = None
    tracer = Tracer(store) if store is not None else None
    try:  # the exporter and the store are closed whatever happens (they flush what they have)
        if tracer is not None and os.environ.get("LANGFUSE_PUBLIC_KEY"):
            from evoharness.harness.tracing.langfuse_export import LangfuseExporter

            exporter = LangfuseExporter(tracer.store)  # credentials from LANGFUSE_* variables
            exporter.start()
        with progress_bar() as progress:
            bar = progress.add_task(escape(label), total=len(tasks))
            results = asyncio.run(
                run_tasks(
                    env,
                    tasks,
                    model_factory=factory,
                    middleware_factory=middleware,
                    concurrency=concurrency,
                    on_result=lambda _: progress.advance(bar),
                    tracer=tracer,
                    tags=[split, "harnessed" if harness else "bare", model],
                    deadline_s=task_deadline_s,
                )
            )
        if tracer is not None and not tracer.store.flush(30):
            console.print("[yellow]warning: traces still being written after 30 s[/yellow]")
        if exporter is not None:
            try:
                exported = exporter.drain(timeout=60)
            finally:
                exporter.stop()
                exporter = None  # stopped: not again below
            if not exported:
                console.print(
                    "[yellow]Langfuse export incomplete; the rest stays in the local "
                    "store: evoharness traces export[/yellow]"
                )
        if out is not None:
            write_results(out, results)
        return RunReport.of(results), results
    finally:
        if exporter is not None:  # the run failed before the export
            exporter.stop()
        if tracer is not None:
            tracer.close()
        if store is not None:
            store.close()


def _verbose(ctx: typer.Context, flag: bool) -> bool:
    """``run --verbose``, the root's ``evoharness --verbose`` or ``EVOHARNESS_DEBUG`` set."""
    return flag or bool(ctx.find_root().params.get("verbose")) or wants_traceback([])


def run(
    ctx: typer.Context,
    env: EnvOption = "shop",
    split: Annotated[str, typer.Option(help="Task split: train, val or test.")] = "val",
    model: Annotated[str, typer.Option(help="'offline' (simulated) or 'openai:<name>'.")] = (
        "offline"
    ),
    base_url: BaseUrlOption = None,
    api_key_env: ApiKeyEnvOption = None,
    concurrency: ConcurrencyOption = 8,
    limit: TaskLimitOption = None,
    faults: Annotated[str, typer.Option(help="Fault preset: demo or none.")] = "demo",
    harness: Annotated[bool, typer.Option(help="Wrap the agent in the harness.")] = True,
    out: Annotated[Path | None, typer.Option(help="Per-task results JSONL.")] = None,
    db: TraceDbOption = TRACE_DB,
    trace_db: Annotated[
        Path | None, typer.Option("--trace-db", hidden=True, help="Old name of --db.")
    ] = None,
    trace: Annotated[bool, typer.Option(help="Record traces.")] = True,
    context: Annotated[
        bool, typer.Option(help="Context engineering (projection, offload, summaries).")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(min=0.001, help="Seconds one model request may take (real models)."),
    ] = 60.0,
    max_retries: Annotated[
        int | None, typer.Option(min=0, help="Client retries per model request (real models).")
    ] = 2,
    task_deadline: Annotated[
        float | None,
        typer.Option(min=0.001, help="Seconds one task may take in all; then it is cancelled."),
    ] = 600.0,
    preflight: Annotated[
        bool, typer.Option(help="Check the model endpoint answers before starting tasks.")
    ] = True,
    verbose: TracebackOption = False,
) -> int:
    """Run an environment's split through create_agent and print a results table.

    Exits 1 when the endpoint is unreachable (checked before any task starts) or when every
    task crashed, with the cause in one line on stderr (``--verbose``: its traceback first;
    any other error's traceback the CLI boundary prints, as for ``evoharness --verbose``).
    """
    from evoharness.sdk.models import EndpointUnreachableError
    from evoharness.sdk.runner import failure_summary

    db = trace_db or db
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = out or Path(".evoharness/runs") / f"{file_safe(env)}-{file_safe(split)}-{stamp}.jsonl"
    try:
        report, results = execute_run(
            env_name=env,
            split=split,
            model=model,
            base_url=base_url,
            api_key_env=api_key_env,
            concurrency=concurrency,
            limit=limit,
            faults=faults,
            harness=harness,
            out=out,
            label=f"{env}/{split}",
            trace_db=db if trace else None,
            context=context,
            timeout_s=timeout,
            max_retries=max_retries,
            task_deadline_s=task_deadline,
            check_endpoint=preflight,
        )
    except EndpointUnreachableError as exc:
        if _verbose(ctx, verbose):
            traceback.print_exc()
        sys.stderr.write(f"evoharness: error: {exc}\n")
        return 1
    label = "harnessed" if harness else "bare"
    console.print(results_table(f"{env} · {split} · model={model}", {label: report}))
    console.print(f"per-task results: {out}", markup=False)
    if trace:
        console.print(f"traces: {db} (see: evoharness traces list --db {db})", markup=False)
    failed = failure_summary(results)
    if failed is not None:
        sys.stderr.write(f"evoharness: error: {failed}\n")
        return 1
    return 0
