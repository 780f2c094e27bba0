"""``evoharness monitor``: run the degradation monitor, record and show its findings."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from evoharness.evolve.cli.options import JudgeEnvOption
from evoharness.harness.errors import ConfigError, RunError
from evoharness.sdk.cli import console
from evoharness.sdk.cli.options import REGISTRY, TRACE_DB, RegistryOption, TagOption, TraceDbOption
from evoharness.sdk.cli.stores import trace_store

if TYPE_CHECKING:  # imported where they run: --help and argument errors need none of them
    from rich.progress import Progress, ProgressColumn

    from evoharness.evolve.episodes.traces import TraceSource
    from evoharness.evolve.monitor import DriftConfig, Finding
    from evoharness.harness.tracing import TraceStore

FAIL_LEVELS = ("critical", "warning", "info", "never")
STYLE = {"critical": "bold red", "warning": "yellow", "info": "dim"}


def spinner(*columns: ProgressColumn) -> Progress:
    """A transient spinner on the console: the step running now, ``columns``, the time so
    far (the monitor's and the report's, whose steps have no total to count against)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        *columns,
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def show_findings(findings: list[Finding], *, title: str) -> None:
    """Print findings as a table (most severe first), with the layer that should act."""
    if not findings:
        console.print(f"{title}: [green]no findings[/green]")
        return
    table = Table(title=title)
    for col in ("severity", "layer", "check", "subject", "finding"):
        table.add_column(col, overflow="fold")
    for f in findings:
        table.add_row(
            f"[{STYLE[f.severity]}]{f.severity}[/]",
            f.layer,
            f.check,
            escape(f.subject),
            escape(f.message),
        )
    console.print(table)


def monitor(
    db: TraceDbOption = TRACE_DB,
    registry: RegistryOption = REGISTRY,
    env: Annotated[
        str | None,
        typer.Option(
            help="Environment plugin whose tools count as registered (default: tools seen "
            "in the most recent runs)."
        ),
    ] = None,
    datasets: Annotated[
        list[Path] | None,
        typer.Option(
            "--datasets",
            exists=True,
            help="Folder(s) with dataset manifests, or manifest files (stale DPO data).",
        ),
    ] = None,
    hours: Annotated[
        float | None, typer.Option(min=0.0, help="Only runs of the last N hours.")
    ] = None,
    tag: TagOption = None,
    judge_env: JudgeEnvOption = None,
    reference: Annotated[int, typer.Option(min=2, help="Runs in the reference window.")] = 50,
    batch: Annotated[int, typer.Option(min=1, help="Look after every N runs.")] = 10,
    alpha: Annotated[float, typer.Option(min=1e-6, max=0.5, help="False-alarm rate.")] = 0.05,
    record: Annotated[
        bool, typer.Option(help="Record the findings in the store (one monitor trace).")
    ] = True,
    show: Annotated[
        bool, typer.Option("--show", help="Only show the latest recorded findings.")
    ] = False,
    langfuse: Annotated[
        bool,
        typer.Option(
            "--langfuse",
            help="Read runs from Langfuse (LANGFUSE_PUBLIC_KEY/SECRET_KEY/BASE_URL) instead "
            "of the local store; findings are still recorded locally (and exported).",
        ),
    ] = False,
    fail_on: Annotated[
        str,
        typer.Option(
            help="Exit 1 when a finding is at least this severe: critical, warning, info or "
            "never (for schedulers that alert on the exit code)."
        ),
    ] = "never",
) -> None:
    """Quality drift, tool decay, stale preference data, context rot: who should act."""
    if fail_on not in FAIL_LEVELS:
        raise ConfigError(
            f"unknown --fail-on {fail_on!r}; choose {', '.join(FAIL_LEVELS)}", field="fail_on"
        )
    from evoharness.evolve.episodes.traces import LangfuseTraceSource, LocalTraceSource
    from evoharness.evolve.monitor import DriftConfig

    if env is not None and not env.strip():
        raise ConfigError(
            "--env is empty; name the environment plugin or leave it out", field="env"
        )
    _check_datasets(datasets or [], registry)
    store = trace_store(db)
    source: TraceSource = LocalTraceSource(store, judge=judge_env)
    exporter = None
    try:
        if langfuse:
            from evoharness.harness.tracing.langfuse_export import LangfuseExporter

            exporter = LangfuseExporter(store)
            source = LangfuseTraceSource(exporter.api, judge=judge_env)
        _monitor(
            store,
            source,
            show=show,
            registry=registry,
            env=env,
            datasets=datasets,
            hours=hours,
            tag=tag,
            config=DriftConfig(reference=reference, batch=batch, alpha=alpha),
            record=record,
            fail_on=fail_on,
        )
    except Exception as exc:
        if langfuse and _is_network_error(exc):
            url = os.environ.get("LANGFUSE_BASE_URL") or os.environ.get("LANGFUSE_HOST") or "-"
            raise RunError(
                f"Langfuse at {url} did not answer ({type(exc).__name__}: {exc}); check "
                "LANGFUSE_BASE_URL and that the server is up, or drop --langfuse to read the "
                "local store"
            ) from exc
        raise
    finally:
        if exporter is not None:
            exporter.stop()
        store.close()


def _monitor(
    store: TraceStore,
    source: TraceSource,
    *,
    show: bool,
    registry: str,
    env: str | None,
    datasets: list[Path] | None,
    hours: float | None,
    tag: list[str] | None,
    config: DriftConfig,
    record: bool,
    fail_on: str,
) -> None:
    from evoharness.evolve.episodes.traces import EpisodeFilter
    from evoharness.evolve.monitor import environment_tools, read_findings, run_monitor
    from evoharness.sdk.registry import open_registry

    if show:
        show_findings(read_findings(source), title="latest monitor findings")
        return
    reg = open_registry(registry) if _registry_there(registry) else None
    try:
        tools = environment_tools(env) if env else None
        where = EpisodeFilter(
            tags=tag or [], since=None if hours is None else time.time() - hours * 3600
        )
        from rich.progress import BarColumn, TextColumn

        with spinner(BarColumn(), TextColumn("{task.fields[info]}")) as progress:
            task = progress.add_task("monitor", total=None, info="")

            def tick(step: str, done: int, total: int) -> None:
                if total:
                    progress.update(task, description=step, completed=done, total=total, info="")
                else:
                    progress.update(task, description=step, info=f"{done} runs")

            report = run_monitor(
                source,
                registry=reg,
                config=config,
                where=where,
                registered_tools=tools,
                dataset_dirs=datasets or [],
                record_to=store if record else None,
                on_progress=tick,
            )
        console.print(
            f"read {report.episodes} runs ({report.judged} judged), {report.tool_calls} tool calls"
            f" in {report.seconds:.1f} s"
            + (f"; recorded as trace {report.trace_id}" if report.trace_id else "")
        )
        show_findings(report.findings, title="monitor findings")
    finally:
        if reg is not None:
            reg.close()
    worst = min((FAIL_LEVELS.index(f.severity) for f in report.findings), default=len(FAIL_LEVELS))
    if worst <= FAIL_LEVELS.index(fail_on) and fail_on != "never":
        raise typer.Exit(1)


def _registry_there(registry: str) -> bool:
    return bool(registry) and ("://" in registry or Path(registry).exists())


def _check_datasets(datasets: list[Path], registry: str) -> None:
    """Every ``--datasets`` path holds a dataset manifest, and there is a registry to check
    them against (without either the stale-data check cannot run: say so, do not skip)."""
    if not datasets:
        return
    from evoharness.evolve.monitor.checks import load_manifests

    for path in datasets:
        if not load_manifests([path]):
            where = "is not a dataset manifest" if path.is_file() else "holds no dataset manifest"
            raise ConfigError(
                f"--datasets {path} {where} (manifest.json, written with each training "
                "dataset); pass the folder the weights layer wrote its datasets to",
                field="datasets",
            )
    if not _registry_there(registry):
        raise ConfigError(
            f"--datasets needs the registry the adapters are in; no registry at {registry} "
            "(pass --registry)",
            field="datasets",
        )


def _is_network_error(exc: BaseException) -> bool:
    """A timeout or connection failure talking to a server (httpx's, or the SDK's wrapper)."""
    import httpx

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, httpx.TransportError | TimeoutError | ConnectionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
