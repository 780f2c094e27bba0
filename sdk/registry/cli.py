"""``evoharness registry``: inspect any artifact and move its labels (promote, rollback).

Works for every kind (guard rules, memory snapshots, prompts, adapters, ...). The registry is
``--registry`` (a SQLite path or a ``postgresql://`` URL; default ``.evoharness/registry.db``,
or ``EVOHARNESS_REGISTRY``). Exit codes: 0 done, 1 the registry said no (missing version or
label, unreachable database), 2 bad arguments.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from evoharness.sdk.registry import Registry, RegistryError, open_registry
from evoharness.sdk.registry._sql import pretty_json

console = Console(soft_wrap=True)
app = typer.Typer(
    help="Inspect artifact versions and move labels: list, versions, show, diff, promote, "
    "rollback, events.",
    no_args_is_help=True,
)
RegistryOption = Annotated[
    str,
    typer.Option(
        "--registry",
        envvar="EVOHARNESS_REGISTRY",
        help="A SQLite path or postgresql://user@host:5432/db",
    ),
]
DEFAULT = ".evoharness/registry.db"
KindArg = Annotated[str, typer.Argument(help="guard_rules, memory, prompt, adapter, ...")]
NameArg = Annotated[str, typer.Argument(help="The artifact's name")]
LabelOption = Annotated[str, typer.Option(help="The label to move")]
ActorOption = Annotated[str, typer.Option(help="Recorded in the audit log")]
ReasonOption = Annotated[str, typer.Option(help="Why (recorded in the audit log)")]


@contextmanager
def _open(url: str) -> Iterator[Registry]:
    try:
        with open_registry(url) as reg:
            yield reg
    except RegistryError as exc:  # includes ArtifactNotFound
        sys.stderr.write(f"evoharness: {exc}\n")
        raise typer.Exit(1) from exc


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


@app.command("list")
def list_names(kind: KindArg, registry: RegistryOption = DEFAULT) -> None:
    """Artifacts of one kind with their latest version and labels."""
    with _open(registry) as reg:
        table = Table(title=f"{kind} artifacts")
        for col in ("name", "latest", "labels"):
            table.add_column(col)
        for name in reg.names(kind):
            labels = ", ".join(f"{k}=v{v}" for k, v in reg.labels(kind, name).items())
            table.add_row(name, f"v{reg.get(kind, name).version}", labels)
        console.print(table)


@app.command()
def versions(kind: KindArg, name: NameArg, registry: RegistryOption = DEFAULT) -> None:
    """Every version of one artifact, oldest first, with the labels pointing at it."""
    with _open(registry) as reg:
        by_version: dict[int, list[str]] = {}
        for label, number in reg.labels(kind, name).items():
            by_version.setdefault(number, []).append(label)
        table = Table(title=f"{kind}/{name}")
        for col in ("version", "created (UTC)", "author", "parent", "hash", "labels"):
            table.add_column(col)
        for v in reg.versions(kind, name):
            table.add_row(
                f"v{v.version}",
                _when(v.created_at),
                v.author,
                "" if v.parent is None else f"v{v.parent}",
                v.content_hash.removeprefix("sha256:")[:12],
                ", ".join(sorted(by_version.get(v.version, []))),
            )
        console.print(table)


@app.command()
def show(
    kind: KindArg,
    name: NameArg,
    version: Annotated[int | None, typer.Argument(help="Default: the latest")] = None,
    label: Annotated[str | None, typer.Option(help="Show what this label serves")] = None,
    registry: RegistryOption = DEFAULT,
) -> None:
    """One version as JSON (content, metadata, author, parent)."""
    with _open(registry) as reg:
        v = reg.get(kind, name, version, label=label)
        typer.echo(pretty_json(v.model_dump(mode="json")))


@app.command()
def diff(
    kind: KindArg,
    name: NameArg,
    a: Annotated[int, typer.Argument(help="From version")],
    b: Annotated[int, typer.Argument(help="To version")],
    registry: RegistryOption = DEFAULT,
) -> None:
    """A unified diff of two versions' content."""
    with _open(registry) as reg:
        typer.echo(reg.diff(kind, name, a, b) or f"v{a} and v{b} have the same content")


@app.command()
def promote(
    kind: KindArg,
    name: NameArg,
    version: Annotated[int, typer.Argument(help="The version to serve")],
    label: LabelOption = "active",
    actor: ActorOption = "cli",
    reason: ReasonOption = "",
    registry: RegistryOption = DEFAULT,
) -> None:
    """Point a label at a version (audited; remembered for rollback)."""
    with _open(registry) as reg:
        e = reg.promote(kind, name, version, label=label, actor=actor, reason=reason)
        was = "nothing" if e.previous is None else f"v{e.previous}"
        console.print(f"{kind}/{name} {label}: v{e.version} (was {was})")


@app.command()
def rollback(
    kind: KindArg,
    name: NameArg,
    label: LabelOption = "active",
    actor: ActorOption = "cli",
    reason: ReasonOption = "",
    registry: RegistryOption = DEFAULT,
) -> None:
    """Point a label back at the version it served before its last move."""
    with _open(registry) as reg:
        e = reg.rollback(kind, name, label=label, actor=actor, reason=reason)
        console.print(f"{kind}/{name} {label}: v{e.version} (was v{e.previous})")


@app.command()
def events(
    kind: Annotated[str | None, typer.Argument(help="Only this kind")] = None,
    name: Annotated[str | None, typer.Argument(help="Only this artifact")] = None,
    last: Annotated[int, typer.Option(min=1, help="Show the last N events")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False,
    registry: RegistryOption = DEFAULT,
) -> None:
    """The audit log (oldest first)."""
    with _open(registry) as reg:
        log = reg.events(kind, name)[-last:]
    if as_json:
        for e in log:
            typer.echo(json.dumps(e.model_dump(mode="json"), sort_keys=True))
        return
    table = Table(title="registry events")
    for col in ("id", "at (UTC)", "artifact", "action", "label", "version", "was", "actor", "why"):
        table.add_column(col, overflow="fold")
    for e in log:
        table.add_row(
            str(e.id),
            _when(e.at),
            f"{e.kind}/{e.name}",
            e.action,
            e.label or "",
            "" if e.version is None else f"v{e.version}",
            "" if e.previous is None else f"v{e.previous}",
            e.actor,
            e.reason,
        )
    console.print(table)
