"""``evoharness registry``: inspect any artifact and move its labels (promote, rollback).

Works for every kind (guard rules, memory snapshots, prompts, adapters, ...). The registry is
``--registry`` (a SQLite path or a ``postgresql://`` URL; default ``.evoharness/registry.db``,
or ``EVOHARNESS_REGISTRY``). Exit codes: 0 done, 1 the registry said no (missing version or
label, unreachable database), 2 bad arguments.

``promote`` and ``rollback`` are the one implementation of a label move: ``evoharness prompts
promote|rollback`` are these commands with the kind fixed (:func:`for_kind`). A prompt's
active label moves through its rollout (:class:`~evoharness.sdk.rollout.RolloutController`),
so a promotion or rollback also settles a running rollout.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.markup import escape
from rich.table import Table

from evoharness.harness.errors import ConfigError
from evoharness.sdk.cli.console import console
from evoharness.sdk.cli.options import (
    REGISTRY,
    ActorOption,
    LabelOption,
    PromptsInLangfuseOption,
    ReasonOption,
    RegistryOption,
)

if TYPE_CHECKING:  # imported where they run: --help and argument errors need none of them
    from evoharness.sdk.prompts.store import PromptStore
    from evoharness.sdk.registry import Registry

__all__ = ["app", "for_kind", "label_given", "promote", "prompt_store", "rollback"]

app = typer.Typer(
    help="Inspect artifact versions and move labels: list, versions, show, diff, promote, "
    "rollback, events.",
    no_args_is_help=True,
)
KindArg = Annotated[str, typer.Argument(help="guard_rules, memory, prompt, adapter, ...")]
NameArg = Annotated[str, typer.Argument(help="The artifact's name")]
VersionArg = Annotated[
    int | None,
    typer.Argument(
        min=1, help="The version to serve (a prompt in a rollout: default its candidate)"
    ),
]


ACTIVE = "active"
"""The label a move takes by default: the registry's own default (``Registry.promote``)."""


@contextmanager
def _open(url: str) -> Iterator[Registry]:
    """The registry at ``url``, closed afterwards; its errors (a missing version: exit 1, a
    file that is no registry: exit 2) reach the CLI's one-line boundary."""
    from evoharness.sdk.registry import open_registry

    with open_registry(url) as reg:
        yield reg


def label_given(label: str | None) -> str | None:
    """``--label`` as given; an empty one is refused (it names no label)."""
    if label is not None and not label.strip():
        raise ConfigError("--label is empty; name a label (active, candidate, ...)", field="label")
    return label


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


@app.command("list")
def list_names(kind: KindArg, registry: RegistryOption = REGISTRY) -> None:
    """Artifacts of one kind with their latest version and labels."""
    with _open(registry) as reg:
        table = Table(title=escape(f"{kind} artifacts"))
        for col in ("name", "latest", "labels"):
            table.add_column(col)
        for name in reg.names(kind):
            labels = ", ".join(f"{k}=v{v}" for k, v in reg.labels(kind, name).items())
            table.add_row(escape(name), f"v{reg.get(kind, name).version}", escape(labels))
        console.print(table)


@app.command()
def versions(kind: KindArg, name: NameArg, registry: RegistryOption = REGISTRY) -> None:
    """Every version of one artifact, oldest first, with the labels pointing at it."""
    with _open(registry) as reg:
        by_version: dict[int, list[str]] = {}
        for label, number in reg.labels(kind, name).items():
            by_version.setdefault(number, []).append(label)
        table = Table(title=escape(f"{kind}/{name}"))
        for col in ("version", "created (UTC)", "author", "parent", "hash", "labels"):
            table.add_column(col)
        for v in reg.versions(kind, name):
            table.add_row(
                f"v{v.version}",
                _when(v.created_at),
                escape(v.author),
                "" if v.parent is None else f"v{v.parent}",
                v.content_hash.removeprefix("sha256:")[:12],
                escape(", ".join(sorted(by_version.get(v.version, [])))),
            )
        console.print(table)


@app.command()
def show(
    kind: KindArg,
    name: NameArg,
    version: Annotated[int | None, typer.Argument(min=1, help="Default: the latest")] = None,
    label: Annotated[str | None, typer.Option(help="Show what this label serves")] = None,
    registry: RegistryOption = REGISTRY,
) -> None:
    """One version as JSON (content, metadata, author, parent)."""
    label_given(label)
    with _open(registry) as reg:
        v = reg.get(kind, name, version, label=label)
        from evoharness.sdk.registry._sql import pretty_json

        typer.echo(pretty_json(v.model_dump(mode="json")))


@app.command()
def diff(
    kind: KindArg,
    name: NameArg,
    a: Annotated[int, typer.Argument(min=1, help="From version")],
    b: Annotated[int, typer.Argument(min=1, help="To version")],
    registry: RegistryOption = REGISTRY,
) -> None:
    """A unified diff of two versions' content."""
    with _open(registry) as reg:
        typer.echo(reg.diff(kind, name, a, b) or f"v{a} and v{b} have the same content")


def prompt_store(reg: Registry, langfuse: bool) -> PromptStore:
    """Where prompt versions and labels live: ``reg``, or Langfuse with ``--langfuse``."""
    from evoharness.sdk.prompts.store import RegistryPromptStore

    local = RegistryPromptStore(reg)
    if not langfuse:
        return local
    from evoharness.harness import require_extra
    from evoharness.sdk.prompts import LangfusePromptStore

    lf = require_extra("langfuse", extra="langfuse", feature="--langfuse")
    missing = [k for k in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY") if not os.environ.get(k)]
    if missing:
        raise ConfigError(f"--langfuse needs {missing} in the environment", field="langfuse")
    return LangfusePromptStore(lf.Langfuse(tracing_enabled=False), fallback=local)


def _version(number: int | None) -> str:
    return "nothing" if number is None else f"v{number}"


def _move(
    action: Literal["promote", "rollback"],
    kind: str,
    name: str,
    version: int | None,
    *,
    label: str,
    actor: str,
    reason: str,
    registry: str,
    langfuse: bool,
) -> None:
    """Move ``label`` and print where it points now; the one body of promote and rollback."""
    label_given(label)
    from evoharness.sdk.prompts.store import KIND as PROMPT
    from evoharness.sdk.rollout import RolloutController

    if langfuse and (kind, label) != (PROMPT, ACTIVE):
        raise ConfigError(
            "--langfuse moves the active label of a prompt only; drop it for other kinds and "
            "labels",
            field="langfuse",
        )
    with _open(registry) as reg:
        if (kind, label) == (PROMPT, ACTIVE):  # through the rollout, which it may settle
            store = prompt_store(reg, langfuse)
            was = store.labels(name).get(ACTIVE)
            rollout = RolloutController(reg, store)
            if action == "promote":
                d = rollout.promote(name, version=version, reason=reason, actor=actor)
            else:
                d = rollout.rollback(name, reason=reason, actor=actor)
            now = store.labels(name).get(ACTIVE)
            console.print(
                f"{kind}/{name} {label}: {_version(now)} (was {_version(was)})", markup=False
            )
            console.print(f"{d.action}: {d.reason}; active is v{now}", markup=False)
            return
        if action == "rollback":
            e = reg.rollback(kind, name, label=label, actor=actor, reason=reason)
        elif version is None:
            raise ConfigError(f"name the version of {kind}/{name} to promote", field="version")
        else:
            e = reg.promote(kind, name, version, label=label, actor=actor, reason=reason)
        console.print(
            f"{kind}/{name} {label}: v{e.version} (was {_version(e.previous)})", markup=False
        )


@app.command()
def promote(
    kind: KindArg,
    name: NameArg,
    version: VersionArg = None,
    label: LabelOption = ACTIVE,
    actor: ActorOption = "cli",
    reason: ReasonOption = "manual promote",
    registry: RegistryOption = REGISTRY,
    langfuse: PromptsInLangfuseOption = False,
) -> None:
    """Point a label at a version (audited; remembered for rollback).

    A prompt's active label moves through its rollout: with one running, its candidate (or
    VERSION among them) goes to full traffic. New sessions get the version at once; running
    sessions keep theirs.
    """
    _move(
        "promote",
        kind,
        name,
        version,
        label=label,
        actor=actor,
        reason=reason,
        registry=registry,
        langfuse=langfuse,
    )


@app.command()
def rollback(
    kind: KindArg,
    name: NameArg,
    label: LabelOption = ACTIVE,
    actor: ActorOption = "cli",
    reason: ReasonOption = "manual rollback",
    registry: RegistryOption = REGISTRY,
    langfuse: PromptsInLangfuseOption = False,
) -> None:
    """Point a label back at the version it served before its last move.

    For a prompt's active label with a rollout running, the rollout ends instead (everyone
    new gets its control). New sessions get the version at once; running sessions keep theirs.
    """
    _move(
        "rollback",
        kind,
        name,
        None,
        label=label,
        actor=actor,
        reason=reason,
        registry=registry,
        langfuse=langfuse,
    )


def for_kind(command: Callable[..., None], kind: str) -> Callable[..., None]:
    """A registry command whose first parameter is KIND, with the kind fixed.

    The result has the same options, help and output, one argument fewer; register it on
    another group (``evoharness prompts promote`` is ``for_kind(promote, "prompt")``).
    """
    signature = inspect.signature(command, eval_str=True)  # typer reads the evaluated types
    first, *rest = signature.parameters.values()
    if first.name != "kind":
        raise TypeError(f"{command.__name__} takes no kind first")

    @functools.wraps(command)
    def bound(*args: Any, **kwargs: Any) -> None:
        command(kind, *args, **kwargs)

    bound.__signature__ = signature.replace(parameters=rest)  # type: ignore[attr-defined]
    return bound


@app.command()
def events(
    kind: Annotated[str | None, typer.Argument(help="Only this kind")] = None,
    name: Annotated[str | None, typer.Argument(help="Only this artifact")] = None,
    last: Annotated[int, typer.Option(min=1, help="Show the last N events")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line")] = False,
    registry: RegistryOption = REGISTRY,
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
            escape(f"{e.kind}/{e.name}"),
            escape(e.action),
            escape(e.label or ""),
            "" if e.version is None else f"v{e.version}",
            "" if e.previous is None else f"v{e.previous}",
            escape(e.actor),
            escape(e.reason),
        )
    console.print(table)
