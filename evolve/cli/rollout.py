"""``evoharness rollout``: staged rollouts of any artifact kind (memory snapshots, guard-rule
versions, adapter versions, skill sets; prompts too, which ``evoharness prompts`` also runs).

``evoharness evolve cycle`` starts the rollouts of the memory snapshots and guard-rule
versions it proves, ``evoharness weights activate --rollout`` those of adapters; these
commands start one by hand, show it, let the decision engine decide from the traced
sessions (``status --db ... --apply``), and promote or roll back by hand.
"""

from __future__ import annotations

from contextlib import closing, nullcontext
from typing import Annotated

import typer

from evoharness.sdk import cli as sdk_cli
from evoharness.sdk.cli.options import (
    REGISTRY,
    STAGED,
    ActorOption,
    ApplyOption,
    OutcomesDbOption,
    ReasonOption,
    RegistryOption,
    Staging,
    grouped,
    non_empty,
    rollout_options,
)
from evoharness.sdk.cli.stores import trace_store

console = sdk_cli.console
app = typer.Typer(
    help="Staged rollouts of any artifact kind: start, status (decide), promote, rollback.",
    no_args_is_help=True,
)
Kind = Annotated[
    str, typer.Argument(callback=non_empty, help="memory, guard_rules, adapter, skills or prompt")
]
Name = Annotated[
    str, typer.Argument(callback=non_empty, help="The artifact's name (e.g. default, policy)")
]


@app.command("start")
@grouped("staging", rollout_options)
def start(
    kind: Kind,
    name: Name,
    version: Annotated[int, typer.Argument(min=1, help="The candidate version")],
    staging: Staging = STAGED,
    reason: ReasonOption = "",
    actor: ActorOption = "cli",
    registry: RegistryOption = REGISTRY,
) -> None:
    """Start a staged rollout of VERSION against the active version (or, for a kind that
    has none yet, against nothing served)."""
    from evoharness.sdk.registry import open_registry
    from evoharness.sdk.rollout import RolloutController

    with open_registry(registry) as reg:
        exp = RolloutController(reg).start(
            name, version, kind=kind, **staging.settings(), actor=actor, reason=reason
        )
    control = f"v{exp.control.version}" if exp.control.version is not None else "nothing"
    console.print(
        f"started {exp.id}: {kind}/{name} v{version} vs {control}, stages "
        f"{', '.join(f'{s:.0%}' for s in exp.stages)}, dwell {exp.min_dwell_s:g} s",
        markup=False,
    )


@app.command("status")
def status(
    kind: Kind,
    name: Name,
    db: OutcomesDbOption = None,
    apply: ApplyOption = False,
    registry: RegistryOption = REGISTRY,
) -> None:
    """The rollout's state and recent decisions; with --db, the engine's decision now from
    the judged sessions of each arm."""
    from evoharness.sdk.cli.prompts import show_rollout
    from evoharness.sdk.registry import open_registry
    from evoharness.sdk.rollout import RolloutController

    traces = trace_store(db) if db is not None else None  # a bad --db: refused first
    with open_registry(registry) as reg, closing(traces) if traces else nullcontext():
        head = f"{kind}/{name}: labels {reg.labels(kind, name)}"
        show_rollout(RolloutController(reg), name, kind=kind, head=head, traces=traces, apply=apply)


@app.command("promote")
def promote(
    kind: Kind,
    name: Name,
    version: Annotated[int | None, typer.Option(min=1, help="Among several candidates")] = None,
    reason: ReasonOption = "manual promote",
    actor: ActorOption = "cli",
    registry: RegistryOption = REGISTRY,
) -> None:
    """The running rollout's candidate goes to full traffic and becomes active (with none
    running, --version becomes active)."""
    from evoharness.sdk.registry import open_registry
    from evoharness.sdk.rollout import RolloutController

    with open_registry(registry) as reg:
        d = RolloutController(reg).promote(
            name, kind=kind, version=version, reason=reason, actor=actor
        )
        now = reg.labels(kind, name).get("active")
    console.print(f"{kind}/{name}: {d.reason}; active is v{now}", markup=False)


@app.command("rollback")
def rollback(
    kind: Kind,
    name: Name,
    reason: ReasonOption = "manual rollback",
    actor: ActorOption = "cli",
    registry: RegistryOption = REGISTRY,
) -> None:
    """End the running rollout (everyone new gets the control), or, with none running,
    serve the version active before the last promote."""
    from evoharness.sdk.registry import open_registry
    from evoharness.sdk.rollout import RolloutController

    with open_registry(registry) as reg:
        d = RolloutController(reg).rollback(name, kind=kind, reason=reason, actor=actor)
        now = reg.labels(kind, name).get("active")
    active = f"v{now}" if now is not None else "nothing"
    console.print(f"{kind}/{name}: {d.reason}; active is {active}", markup=False)
