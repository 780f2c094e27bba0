"""``evoharness traces``: look at the local trace store, back it up and export it.

Where traces live: ``--db``, else ``$EVOHARNESS_TRACE_DB``, else ``.evoharness/traces.db``;
when that does not exist, the newest ``.evoharness/*/traces.db`` (the demo writes
``.evoharness/demo/traces.db``) is shown, and the command says which file it read.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from evoharness.harness.errors import ConfigError
from evoharness.sdk.cli.console import console, progress_bar
from evoharness.sdk.cli.options import TRACE_DB, TagOption, TracebackOption, TraceDbOption
from evoharness.sdk.cli.stores import trace_store

if TYPE_CHECKING:  # imported where they run: --help needs none of them
    from evoharness.harness.tracing import Observation, TraceStore

app = typer.Typer(help="Inspect and export recorded traces.", no_args_is_help=True)


def _find(db: Path) -> Path:
    if db.exists() or db != TRACE_DB:
        return db
    found = sorted(db.parent.glob("*/traces.db"), key=lambda p: p.stat().st_mtime)
    if not found:
        return db
    console.print(
        f"[dim]no store at {escape(str(db))}; showing {escape(str(found[-1]))} (newest under "
        f"{escape(str(db.parent))})[/dim]"
    )
    return found[-1]


def _open(db: Path) -> TraceStore:
    return trace_store(_find(db))


def _preview(value: object, width: int = 80) -> str:
    """``value`` on one line, cut to ``width``, escaped: it is the user's data, not markup
    (``[masked:email]`` would otherwise vanish as a style tag)."""
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return escape(text if len(text) <= width else text[: width - 1] + "…")


@app.command("list")
def list_traces(
    db: TraceDbOption = TRACE_DB,
    limit: Annotated[int, typer.Option(min=1)] = 20,
    status: Annotated[str | None, typer.Option(help="ok, error, running, incomplete")] = None,
    tag: TagOption = None,
) -> None:
    """The newest traces with their status, size and scores."""
    with closing(_open(db)) as store:
        _list(store, limit=limit, status=status, tag=tag)


def _list(store: TraceStore, *, limit: int, status: str | None, tag: list[str] | None) -> None:
    from evoharness.harness.tracing.store import TraceQuery

    table = Table(title=escape(f"traces in {store.path}"))
    for col in ("trace id", "run", "status", "started", "secs", "obs", "tokens", "scores"):
        table.add_column(col, overflow="fold")
    where = TraceQuery(status=status, tags=tag or (), newest_first=True, limit=limit)
    for t, obs, scores_ in store.read(where):  # filtered, ordered and limited in SQL
        tokens = sum(o.usage.total_tokens for o in obs if o.usage)
        scores = ", ".join(f"{s.name}={s.value}" for s in scores_)
        secs = f"{t.end_time - t.start_time:.2f}" if t.end_time else "-"
        table.add_row(
            escape(t.id[:12]),
            escape(t.run_id),
            escape(t.status),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t.start_time)),
            secs,
            str(len(obs)),
            str(tokens),
            escape(scores),
        )
    console.print(table)


@app.command()
def show(
    trace_id: Annotated[str, typer.Argument(help="Trace id or a unique prefix of it")],
    db: TraceDbOption = TRACE_DB,
) -> None:
    """A trace as a tree: agent, model calls, tool calls and harness decisions."""
    with closing(_open(db)) as store:
        _show(store, trace_id)


def _show(store: TraceStore, trace_id: str) -> None:
    from evoharness.harness.tracing.store import TraceQuery

    matches = store.query(TraceQuery(id_prefix=trace_id.lower(), limit=2))
    if len(matches) != 1:
        found = "no trace matches" if not matches else "several traces match"
        raise ConfigError(f"{found} {trace_id!r}; give more of the id")
    t = matches[0]
    obs = store.observations(t.id)
    children: dict[str | None, list[Observation]] = {}
    ids = {o.id for o in obs}
    for o in obs:
        children.setdefault(o.parent_id if o.parent_id in ids else None, []).append(o)
    head = f"[bold]{escape(t.name)}[/bold] " + escape(f"{t.id} run={t.run_id} status={t.status}")
    if t.parent_trace_id:
        head += escape(f" (sub-agent of {t.parent_trace_id[:12]})")
    tree = Tree(head)
    tree.add(f"input: {_preview(t.input)}")

    def label(o: Observation) -> str:
        style = {"generation": "cyan", "tool": "green", "event": "yellow", "agent": "bold"}
        parts = [f"[{style.get(o.type, 'white')}]{escape(o.type)}[/] {escape(o.name)}"]
        if o.latency_ms is not None and o.type != "event":
            parts.append(f"{o.latency_ms:.1f} ms")
        if o.usage:
            parts.append(f"{o.usage.input_tokens}+{o.usage.output_tokens} tok")
        if o.level in ("ERROR", "WARNING"):
            parts.append(f"[red]{o.level}[/red] {escape(o.status_message or '')}")
        if o.type == "tool":
            parts.append(f"args={_preview(o.input, 50)} -> {_preview(o.output, 60)}")
        if o.type == "event":
            parts.append(_preview({k: v for k, v in o.metadata.items() if k != "source"}, 70))
        return "  ".join(parts)

    def add(node: Tree, parent: str | None) -> None:
        for o in children.get(parent, []):
            add(node.add(label(o)), o.id)

    add(tree, None)
    tree.add(f"output: {_preview(t.output)}")
    for s in store.scores(t.id):
        tree.add(escape(f"score {s.name} = {s.value} ({s.source}) {s.comment or ''}"))
    console.print(tree)


@app.command()
def stats(db: TraceDbOption = TRACE_DB) -> None:
    """Row counts, export backlog, run statuses, and each writer's accounting and health.

    Per writer (process): records accepted, stored, spilled (to the JSONL file, stored
    later as ``ingested``), dead-lettered, lost, and whether it is ``ok`` or ``sick``.
    """
    with closing(_open(db)) as store:
        _stats(store)


WRITERS_SHOWN = 10
"""Writers listed one a line in ``traces stats``; older ones are summed in one line."""
ACCOUNTING = ("accepted", "stored", "spilled", "ingested", "dead", "quarantined", "lost")


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _stats(store: TraceStore) -> None:
    counts = store.counts()
    table = Table(title=escape(f"trace store {store.path}"))
    table.add_column("what")
    table.add_column("count", justify="right")
    for key, value in counts.items():
        table.add_row(key, str(value))
    table.add_row("spill backlog (lines)", str(store.spill_backlog()))
    for status, n in store.status_counts().items():
        table.add_row(escape(f"status {status}"), str(n))
    console.print(table)
    writers = store.writers()  # newest first; a store outlives many processes
    for w in writers[:WRITERS_SHOWN]:
        numbers = " ".join(f"{k}={w.get(k, 0)}" for k in ACCOUNTING)
        error = f" error={w['error']}" if w.get("error") else ""
        line = f"writer {w['writer']} health={w['health']} seen={_when(w['seen'])} {numbers}{error}"
        console.print(line, markup=False)
    if len(writers) > WRITERS_SHOWN:
        console.print(_older_writers(writers[WRITERS_SHOWN:]), markup=False)


def _older_writers(older: list[dict[str, Any]]) -> str:
    """One line for the writers beyond the newest few: their count, span and summed numbers."""
    sums = {k: sum(int(w.get(k, 0) or 0) for w in older) for k in ACCOUNTING}
    sick = sum(1 for w in older if w.get("health") != "ok")
    seen = [float(w["seen"]) for w in older]
    return (
        f"{len(older)} older writers (seen {_when(min(seen))} .. {_when(max(seen))}, "
        f"{sick} not ok): " + " ".join(f"{k}={v}" for k, v in sums.items())
    )


@app.command()
def backup(
    target: Annotated[Path, typer.Argument(help="New SQLite file to write the copy to")],
    db: TraceDbOption = TRACE_DB,
) -> None:
    """A consistent copy of a live store (SQLite's backup API; copying the file of a WAL
    database that is being written misses rows)."""
    with closing(_open(db)) as store:
        out = store.backup(target)
        console.print(json.dumps({"backup": str(out), **store.counts()}))


@app.command()
def export(
    db: TraceDbOption = TRACE_DB,
    timeout: Annotated[
        float, typer.Option(min=0.0, help="Give up after this many seconds")
    ] = 120.0,
    verbose: TracebackOption = False,
) -> None:
    """Send everything pending to Langfuse (LANGFUSE_PUBLIC_KEY/SECRET_KEY/BASE_URL)."""
    del verbose  # read by the CLI boundary from the command line
    from evoharness.harness.tracing.langfuse_export import LangfuseExporter

    with closing(_open(db)) as store:
        exporter = LangfuseExporter(store)
        try:
            done = _drain_with_progress(store, lambda: exporter.drain(timeout))
        finally:
            exporter.stop()
        counts = store.counts()
    console.print(
        f"pending after export: traces={counts['traces_pending']} "
        f"observations={counts['observations_pending']} "
        f"scores={counts['scores_pending']}"
    )
    if not done:
        console.print("[red]export incomplete; rows stay pending and will be retried[/red]")
        raise typer.Exit(1)


PENDING = ("traces_pending", "observations_pending", "scores_pending")


def _drain_with_progress(store: TraceStore, drain: Callable[[], bool]) -> bool:
    """Run ``drain()`` (the exporter's) in a thread while a bar counts the pending rows down."""

    def pending() -> int:
        counts = store.counts()
        return sum(counts[k] for k in PENDING)

    result: list[bool] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            result.append(bool(drain()))
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)

    total = pending()
    worker = threading.Thread(target=work, name="evoharness-export", daemon=True)
    with progress_bar("exporting to Langfuse") as progress:
        bar = progress.add_task("export", total=total or None)
        worker.start()
        while worker.is_alive():
            worker.join(0.5)
            progress.update(bar, completed=max(0, total - pending()))
    if failure:
        raise failure[0]
    return result[0]
