"""``evoharness prompts``: list, show, diff and create prompt versions; run their rollouts.

Prompt versions and rollouts live in the artifact registry (``--registry``, default
``.evoharness/registry.db``, or ``EVOHARNESS_REGISTRY``); with ``--langfuse`` the prompt
versions and labels live in Langfuse prompt management instead (keys from the usual
``LANGFUSE_*`` variables) while rollouts and decisions stay audited in the registry.
``promote`` and ``rollback`` are ``evoharness registry promote|rollback prompt ...``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from evoharness.harness.errors import ConfigError
from evoharness.sdk.cli import registry as registry_cli
from evoharness.sdk.cli.console import console
from evoharness.sdk.cli.options import (
    REGISTRY,
    STAGED,
    ActorOption,
    ApplyOption,
    OutcomesDbOption,
    PromptsInLangfuseOption,
    ReasonOption,
    RegistryOption,
    Staging,
    grouped,
    rollout_options,
)
from evoharness.sdk.cli.stores import trace_store

if TYPE_CHECKING:  # imported where they run: --help and argument errors need none of them
    from evoharness.harness.tracing import TraceStore
    from evoharness.sdk.prompts import PromptStore, PromptTemplate
    from evoharness.sdk.registry import Registry
    from evoharness.sdk.rollout import RolloutController

__all__ = ["app", "show_rollout"]

app = typer.Typer(
    help="Prompt versions and their A/B rollouts (staged, sticky, audited).",
    no_args_is_help=True,
)
USER = os.environ.get("USER", "evoharness")  # who creates versions and starts rollouts
KIND = "prompt"
"""The prompts' artifact kind: :data:`evoharness.sdk.prompts.store.KIND` (a test checks),
written here because importing that module costs a second that ``--help`` would pay."""


@contextmanager
def _open(registry: str, langfuse: bool) -> Iterator[tuple[Registry, PromptStore]]:
    """The registry (closed afterwards) and the prompt store on it."""
    from evoharness.sdk.registry import open_registry

    with open_registry(registry) as reg:
        yield reg, registry_cli.prompt_store(reg, langfuse)


@app.command("list")
def list_prompts(
    registry: RegistryOption = REGISTRY, langfuse: PromptsInLangfuseOption = False
) -> None:
    """Every prompt with its versions, the active one, and its rollout."""
    with _open(registry, langfuse) as (reg, store):
        _list(reg, store)


def _list(reg: Registry, store: PromptStore) -> None:
    from evoharness.sdk.prompts import ACTIVE, CANDIDATE
    from evoharness.sdk.rollout import RolloutController

    ctl = RolloutController(reg, store)
    table = Table("prompt", "versions", "active", "candidate", "rollout")
    for name in store.names():
        labels = store.labels(name)
        active = labels.get(ACTIVE)
        sem = store.get(name, active).semver if active is not None else ""
        exp = ctl.current(name)
        roll = f"{exp.id} {exp.status} {exp.traffic:.0%}" if exp is not None else "-"
        table.add_row(
            escape(name),
            str(len(store.versions(name))),
            escape(f"v{active} ({sem})") if active is not None else "-",
            f"v{labels[CANDIDATE]}" if CANDIDATE in labels else "-",
            escape(roll),
        )
    console.print(table)


@app.command("show")
def show(
    name: str,
    version: Annotated[int | None, typer.Option("--version", "-v", min=1)] = None,
    label: Annotated[str | None, typer.Option(help="Label instead of a version.")] = None,
    registry: RegistryOption = REGISTRY,
    langfuse: PromptsInLangfuseOption = False,
) -> None:
    """One version: metadata, sections (kind, static/dynamic, protected) and variables."""
    registry_cli.label_given(label)
    with _open(registry, langfuse) as (_, store):
        v = store.get(name, version, label=label)
    console.print(
        f"[bold]{escape(v.ref)}[/bold] "
        + escape(
            f"semver {v.semver} status {v.status} labels {v.labels or '-'}\n"
            f"author {v.author} parent {v.parent if v.parent is not None else '-'} "
            f"hash {v.content_hash[:19]}\nchangelog: {v.changelog or '-'}"
        )
    )
    for s in v.template.sections:
        flags = ("dynamic" if s.is_dynamic else "static") + (", protected" if s.protected else "")
        console.print(
            f"\n[bold]## {escape(s.name)}[/bold] ({escape(s.kind)}; {flags})\n{escape(s.text)}"
        )
    if v.template.variables:
        console.print("\nvariables: " + json.dumps(v.template.variables), markup=False)


@app.command("diff")
def diff(
    name: str,
    a: Annotated[int, typer.Argument(min=1, help="From version")],
    b: Annotated[int, typer.Argument(min=1, help="To version")],
    registry: RegistryOption = REGISTRY,
    langfuse: PromptsInLangfuseOption = False,
) -> None:
    """Section-aware diff of two versions."""
    from evoharness.sdk.prompts import diff_templates

    with _open(registry, langfuse) as (_, store):
        va, vb = store.get(name, a), store.get(name, b)
    console.print(f"{va.ref} ({va.semver}) -> {vb.ref} ({vb.semver})", markup=False)
    console.print(str(diff_templates(va.template, vb.template)), markup=False)


def _template(path: Path) -> PromptTemplate:
    from evoharness.sdk.prompts import PromptTemplate

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--file {path}: not UTF-8 text (byte {exc.start}); pass a JSON template or a "
            "plain-text prompt",
            field="file",
        ) from exc
    if not text.strip():
        raise ConfigError(f"--file {path} is empty; write the prompt into it", field="file")
    if path.suffix == ".json":
        try:
            return PromptTemplate.model_validate_json(text)
        except ValueError as exc:
            first = str(exc).splitlines()[0]
            raise ConfigError(
                f"--file {path}: not a prompt template ({first}); write "
                '{"sections": [{"name": ..., "kind": ..., "text": ...}]} or plain text',
                field="file",
            ) from exc
    return PromptTemplate.from_text(text.strip())


@app.command("create")
def create(
    name: str,
    file: Annotated[
        Path,
        typer.Option(
            "--file",
            "-f",
            exists=True,
            dir_okay=False,
            help="A JSON template ({sections, variables}) or a plain-text prompt.",
        ),
    ],
    semver: Annotated[str | None, typer.Option(help="Default: bumped from the parent.")] = None,
    changelog: Annotated[str, typer.Option("--changelog", "-m")] = "",
    author: Annotated[str, typer.Option()] = USER,
    parent: Annotated[int | None, typer.Option(min=1, help="Default: the latest version.")] = None,
    allow_protected: Annotated[
        bool, typer.Option(help="Allow changing protected sections of the parent.")
    ] = False,
    activate: Annotated[bool, typer.Option(help="Make it active right away.")] = False,
    registry: RegistryOption = REGISTRY,
    langfuse: PromptsInLangfuseOption = False,
) -> None:
    """Publish a new version (a draft unless --activate)."""
    if semver is not None:
        from evoharness.sdk.prompts.template import check_semver

        try:
            check_semver(semver)
        except ConfigError as exc:
            raise ConfigError(f"--semver: {exc}", field="semver") from exc
    template = _template(file)  # a bad file is refused before the registry is opened
    with _open(registry, langfuse) as (_, store):
        v = store.create(
            name,
            template,
            semver=semver,
            changelog=changelog,
            author=author,
            parent=parent,
            allow_protected_changes=allow_protected,
        )
        if activate:
            store.promote(name, v.version, actor=author, reason=changelog or "created active")
    console.print(f"created {v.ref} ({v.semver}){' active' if activate else ''}", markup=False)


@app.command("rollout")
@grouped("staging", rollout_options)
def rollout(
    name: str,
    version: Annotated[int, typer.Argument(min=1, help="The candidate version")],
    staging: Staging = STAGED,
    reason: ReasonOption = "",
    actor: ActorOption = USER,
    registry: RegistryOption = REGISTRY,
    langfuse: PromptsInLangfuseOption = False,
) -> None:
    """Start a staged rollout of VERSION against the active version."""
    from evoharness.sdk.rollout import RolloutController

    with _open(registry, langfuse) as (reg, store):
        exp = RolloutController(reg, store).start(
            name, version, **staging.settings(), actor=actor, reason=reason
        )
    tol = ", ".join(f"{k} {v:g}" for k, v in exp.tolerances.items()) or "the engine's"
    console.print(
        f"started {exp.id}: v{version} vs control v{exp.control.version}, "
        f"stages {', '.join(f'{s:.0%}' for s in exp.stages)}, dwell {exp.min_dwell_s:g} s, "
        f"tolerances {tol}",
        markup=False,
    )


# One implementation of a label move: the registry's, with the kind fixed.
app.command("promote")(registry_cli.for_kind(registry_cli.promote, KIND))
app.command("rollback")(registry_cli.for_kind(registry_cli.rollback, KIND))


@app.command("status")
def status(
    name: str,
    db: OutcomesDbOption = None,
    apply: ApplyOption = False,
    registry: RegistryOption = REGISTRY,
    langfuse: PromptsInLangfuseOption = False,
) -> None:
    """The rollout's state and recent decisions; with --db, the engine's decision now."""
    with ExitStack() as stack:  # a bad --db is refused whether or not a rollout runs
        traces = stack.enter_context(closing(trace_store(db))) if db is not None else None
        reg, store = stack.enter_context(_open(registry, langfuse))
        _status(reg, store, name, traces=traces, apply=apply)


def _status(
    reg: Registry, store: PromptStore, name: str, *, traces: TraceStore | None, apply: bool
) -> None:
    from evoharness.sdk.prompts import ACTIVE
    from evoharness.sdk.rollout import RolloutController

    labels = store.labels(name)
    head = f"{name}: active v{labels.get(ACTIVE, '-')}, labels {labels}"
    show_rollout(RolloutController(reg, store), name, head=head, traces=traces, apply=apply)


def show_rollout(
    ctl: RolloutController,
    name: str,
    *,
    kind: str = KIND,
    head: str,
    traces: TraceStore | None,
    apply: bool,
) -> None:
    """Print ``head``, then ``kind/name``'s rollout (stage, arms, settings, last decisions)
    and, with ``traces``, the engine's decision now from the judged sessions of each arm
    (taken with ``apply``). ``prompts status`` and ``rollout status`` both print this."""
    from evoharness.sdk.rollout.traces import outcomes_from_store

    exp = ctl.current(name, kind=kind)
    console.print(head, markup=False)
    if exp is None:
        console.print("no rollout")
        return
    arms = ", ".join(f"{a.name}=v{a.version}" for a in [exp.control, *exp.candidates])
    console.print(
        f"{exp.id}: {exp.status}, stage {exp.stage + 1}/{len(exp.stages)} "
        f"({exp.traffic:.0%} exposed), arms {arms}, dwell {exp.min_dwell_s:g} s"
        + (f", tolerances {exp.tolerances}" if exp.tolerances else "")
        + f"\nlast: {exp.reason}",
        markup=False,
    )
    for d in ctl.decisions(exp.id)[-5:]:
        console.print(f"  {d.action:<8} {d.reason}", markup=False)
    if traces is None or not exp.running:
        return
    outcomes = outcomes_from_store(traces, exp)
    if apply:
        d = ctl.evaluate(name, outcomes, kind=kind)
    else:
        d = ctl.engine.decide_outcomes(exp, outcomes, now=ctl.clock())
    console.print(f"decision{'' if apply else ' (dry run)'}: {d.action}: {d.reason}", markup=False)
    for key, iv in sorted(d.intervals.items()):
        console.print(f"  {key:<28} {iv}", markup=False)
