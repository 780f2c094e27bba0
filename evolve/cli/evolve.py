"""``evoharness evolve``: judge traces, route cases, curate memory and guard rules."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from evoharness.evolve.curation import RuleProposer
from evoharness.evolve.cycle import run_cycle, summarize
from evoharness.evolve.jobs import JudgePool, judge_episodes
from evoharness.evolve.judge import DEFAULT_CHECKS, Judge, RuleJudge
from evoharness.evolve.memory import MemoryStore
from evoharness.evolve.routing import route_all
from evoharness.evolve.rubric import RubricGenerator
from evoharness.evolve.state import EvolveState
from evoharness.evolve.traces import EpisodeFilter, LocalTraceSource
from evoharness.harness import ConfigError
from evoharness.harness.tracing import TraceStore
from evoharness.sdk import cli as sdk_cli
from evoharness.sdk.cli.traces import TRACE_DB
from evoharness.sdk.registry import GuardRuleVersions, open_registry

console = sdk_cli.console
app = typer.Typer(
    help="Judge traces, route cases, curate memory and guard rules.", no_args_is_help=True
)
HOME = Path(".evoharness")
DbOption = Annotated[Path, typer.Option("--db", help="Local trace store (SQLite).")]
StateOption = Annotated[Path, typer.Option(help="Evolve state (SQLite).")]
MemoryOption = Annotated[Path, typer.Option(help="Memory store (SQLite).")]
RegistryOption = Annotated[
    str,
    typer.Option(
        envvar="EVOHARNESS_REGISTRY",
        help="Artifact registry (guard rules, memory snapshots): a SQLite path or postgresql://...",
    ),
]
REGISTRY = str(HOME / "registry.db")
TagOption = Annotated[list[str] | None, typer.Option("--tag", help="Only traces with these tags")]


def _grader_and_rubrics(env: str) -> tuple[Judge, RubricGenerator, RuleProposer]:
    if env == "shop":
        from evoharness.examples.shop.judge import ShopRules

        rules = ShopRules()
        return (
            Judge(RuleJudge([*DEFAULT_CHECKS, rules.check])),
            RubricGenerator(extra_items=rules.items, cache_path=HOME / "rubrics.db"),
            RuleProposer(pattern=rules.pattern, hints=rules.hints()),
        )
    if env == "none":
        return Judge(RuleJudge()), RubricGenerator(cache_path=HOME / "rubrics.db"), RuleProposer()
    raise ConfigError(f"unknown --env {env!r}; choose shop or none", field="env")


def shop_grader() -> Judge:
    """Picklable factory for pool workers: the shop's rule judge."""
    return _grader_and_rubrics("shop")[0]


def shop_rubrics() -> RubricGenerator:
    """Picklable factory for pool workers: the shop's rubrics."""
    return _grader_and_rubrics("shop")[1]


def plain_grader() -> Judge:
    """Picklable factory for pool workers: generic rules only."""
    return _grader_and_rubrics("none")[0]


def plain_rubrics() -> RubricGenerator:
    """Picklable factory for pool workers: generic rubrics."""
    return _grader_and_rubrics("none")[1]


FACTORIES = {"shop": (shop_grader, shop_rubrics), "none": (plain_grader, plain_rubrics)}


def _source(db: Path) -> LocalTraceSource:
    if not db.exists():
        raise ConfigError(f"no trace store at {db}; run `evoharness run` first or pass --db")
    return LocalTraceSource(TraceStore(db))


@app.command()
def judge(
    db: DbOption = TRACE_DB,
    state: StateOption = HOME / "evolve.db",
    tag: TagOption = None,
    env: Annotated[str, typer.Option(help="Rules for: shop, none")] = "shop",
    concurrency: Annotated[int, typer.Option(min=1, max=256)] = 8,
    workers: Annotated[int, typer.Option(min=1, max=32, help="Processes (JudgePool)")] = 1,
) -> None:
    """Judge every unjudged trace (resumable) and write scores back to the store."""
    source = _source(db)
    grader, rubrics, _ = _grader_and_rubrics(env)
    episodes = list(source.episodes(EpisodeFilter(tags=tag or [])))
    if workers > 1:
        grader_factory, rubrics_factory = FACTORIES[env]
        with JudgePool(
            grader_factory=grader_factory,
            rubrics_factory=rubrics_factory,
            state_path=state,
            scores_path=db,
            workers=workers,
        ) as pool:
            report = pool.judge(episodes, concurrency=concurrency)
    else:
        st = EvolveState(state)
        with Progress(
            TextColumn("judging"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            transient=True,
        ) as progress:
            bar = progress.add_task("judge", total=len(episodes))
            report = asyncio.run(
                judge_episodes(
                    episodes,
                    grader=grader,
                    rubrics=rubrics,
                    state=st,
                    scores_to=source.store,
                    concurrency=concurrency,
                    on_progress=lambda *_: progress.advance(bar),
                )
            )
        source.store.flush(30)
    console.print(f"judged={report.judged} skipped={report.skipped} failed={report.failed}")


@app.command()
def route(
    db: DbOption = TRACE_DB, state: StateOption = HOME / "evolve.db", tag: TagOption = None
) -> None:
    """Route judged traces into pools (SFT, strategies, guard, replay, preference, lessons)."""
    source = _source(db)
    st = EvolveState(state)
    added = route_all(list(source.episodes(EpisodeFilter(tags=tag or []))), st.verdicts(), st)
    table = Table(title="routed cases")
    table.add_column("pool")
    table.add_column("added", justify="right")
    table.add_column("total", justify="right")
    sizes = st.pool_sizes()
    for name, n in added.items():
        table.add_row(name, str(n), str(sizes.get(name, 0)))
    console.print(table)


@app.command()
def memory(
    action: Annotated[
        str, typer.Argument(help="list, versions, export, import, restore, rollback")
    ] = "list",
    target: Annotated[str | None, typer.Argument(help="file (export/import) or version")] = None,
    path: MemoryOption = HOME / "memory.db",
    registry: RegistryOption = REGISTRY,
) -> None:
    """Look at and manage the learned memory (snapshots in the registry, reversible)."""
    store = MemoryStore(path, registry=open_registry(registry))
    if action == "list":
        table = Table(title=f"memory {path}")
        for col in ("id", "kind", "pattern", "summary", "conf", "+/-", "refs"):
            table.add_column(col, overflow="fold")
        for e in sorted(store.entries().values(), key=lambda e: (e.kind, e.id)):
            table.add_row(
                e.id,
                e.kind,
                e.query_pattern,
                e.summary,
                f"{e.confidence:.2f}",
                f"{e.helpful}/{e.harmful}",
                str(len(e.references)),
            )
        console.print(table)
    elif action == "versions":
        active = store.active_version()
        for version, created, note in store.versions():
            mark = " (active)" if version == active else ""
            console.print(f"v{version}{mark}  {created:.0f}  {note}")
    elif action in ("export", "import") and target:
        n = (
            store.export_json(Path(target))
            if action == "export"
            else store.import_json(Path(target))
        )
        console.print(f"{action}: {n}")
    elif action == "restore" and target and target.lstrip("v").isdigit():
        console.print(f"active: v{store.restore(int(target.lstrip('v')))}")
    elif action == "rollback":
        console.print(f"active: v{store.rollback()}")
    else:
        raise ConfigError(f"bad memory command {action!r} {target or ''}".strip(), field="action")


@app.command()
def guard(
    action: Annotated[
        str, typer.Argument(help="show, rollback, versions, export, import")
    ] = "show",
    target: Annotated[Path | None, typer.Argument(help="rule file (export/import)")] = None,
    registry: RegistryOption = REGISTRY,
    name: Annotated[str, typer.Option(help="Rule set (artifact name)")] = "default",
) -> None:
    """Show the active output-guard rules, roll back, list versions, export or import a file."""
    files = GuardRuleVersions(open_registry(registry), name)
    if action == "rollback":
        console.print(f"now v{files.rollback(reason='cli rollback').version}")
    elif action == "versions":
        for v in files.versions():
            console.print(f"v{v}" + (" (active)" if v == files.load().version else ""))
        return
    elif action in ("export", "import") and target is not None:
        done = files.export_json(target) if action == "export" else files.import_json(target)
        console.print(f"{action}: v{done.version} ({len(done.rules)} rules)")
        return
    elif action != "show":
        raise ConfigError(
            f"bad guard command {action!r}; use show, rollback, versions, export FILE or "
            "import FILE",
            field="action",
        )
    current = files.load()
    console.print(f"guard rules v{current.version} ({len(current.rules)} rules)")
    for r in current.rules:
        console.print(f"- {r.name}: {r.pattern} ({r.action}, {r.source})")


@app.command()
def cycle(
    db: DbOption = TRACE_DB,
    state: StateOption = HOME / "evolve.db",
    memory_path: MemoryOption = HOME / "memory.db",
    registry: RegistryOption = REGISTRY,
    tag: TagOption = None,
    env: Annotated[str, typer.Option(help="Rules for: shop, none")] = "shop",
    concurrency: Annotated[int, typer.Option(min=1, max=256)] = 8,
) -> None:
    """collect -> judge -> route -> curate, in one resumable run."""
    source = _source(db)
    grader, rubrics, proposer = _grader_and_rubrics(env)
    artifacts = open_registry(registry)
    report = asyncio.run(
        run_cycle(
            source,
            where=EpisodeFilter(tags=tag or []),
            grader=grader,
            rubrics=rubrics,
            state=EvolveState(state),
            memory=MemoryStore(memory_path, registry=artifacts),
            proposer=proposer,
            guard_rules=GuardRuleVersions(artifacts),
            scores_to=source.store,
            concurrency=concurrency,
        )
    )
    source.store.flush(30)
    table = Table(title="evolve cycle")
    table.add_column("what")
    table.add_column("value", justify="right")
    for k, v in summarize(report).items():
        table.add_row(k, str(v))
    console.print(table)
    if report.guard_diff:
        console.print(report.guard_diff)
