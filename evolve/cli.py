"""The full ``evoharness`` command line: the SDK's commands plus ``evolve`` and ``demo``.

The console script points here (evolve is the top layer; the SDK's CLI does not import
evolve). ``main(argv)`` returns an exit code like the SDK's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from evoharness.evolve.curation import RuleProposer
from evoharness.evolve.cycle import run_cycle, summarize
from evoharness.evolve.demo import Phase, run_demo
from evoharness.evolve.jobs import JudgePool, judge_episodes
from evoharness.evolve.judge import DEFAULT_CHECKS, Judge, RuleJudge
from evoharness.evolve.memory import MemoryStore
from evoharness.evolve.routing import GuardRuleFiles, route_all
from evoharness.evolve.rubric import RubricGenerator
from evoharness.evolve.state import EvolveState
from evoharness.evolve.traces import EpisodeFilter, LocalTraceSource
from evoharness.harness import ConfigError
from evoharness.harness.tracing import TraceStore
from evoharness.sdk import cli as sdk_cli
from evoharness.sdk.cli_traces import TRACE_DB

app = sdk_cli.app
console = sdk_cli.console
evolve_app = typer.Typer(
    help="Judge traces, route cases, curate memory and guard rules.", no_args_is_help=True
)
app.add_typer(evolve_app, name="evolve")
HOME = Path(".evoharness")
DbOption = Annotated[Path, typer.Option("--db", help="Local trace store (SQLite).")]
StateOption = Annotated[Path, typer.Option(help="Evolve state (SQLite).")]
MemoryOption = Annotated[Path, typer.Option(help="Memory store (SQLite).")]
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


@evolve_app.command()
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


@evolve_app.command()
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


@evolve_app.command()
def memory(
    action: Annotated[str, typer.Argument(help="list, versions, export, import, restore")] = "list",
    target: Annotated[str | None, typer.Argument(help="file (export/import) or version")] = None,
    path: MemoryOption = HOME / "memory.db",
) -> None:
    """Look at and manage the learned memory (versioned, reversible)."""
    store = MemoryStore(path)
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
        for version, created, note in store.versions():
            console.print(f"v{version}  {created:.0f}  {note}")
    elif action in ("export", "import") and target:
        n = (
            store.export_json(Path(target))
            if action == "export"
            else store.import_json(Path(target))
        )
        console.print(f"{action}: {n}")
    elif action == "restore" and target and target.lstrip("v").isdigit():
        console.print(f"restored as v{store.restore(int(target.lstrip('v')))}")
    else:
        raise ConfigError(f"bad memory command {action!r} {target or ''}".strip(), field="action")


@evolve_app.command()
def guard(
    action: Annotated[str, typer.Argument(help="show or rollback")] = "show",
    directory: Annotated[Path, typer.Option(help="Rule files")] = HOME / "guard_rules",
) -> None:
    """Show the current output-guard rules, or roll back to the previous version."""
    files = GuardRuleFiles(directory)
    if action == "rollback":
        console.print(f"now v{files.rollback().version}")
    elif action != "show":
        raise ConfigError(f"bad guard command {action!r}; use show or rollback", field="action")
    current = files.load()
    console.print(f"guard rules v{current.version} ({len(current.rules)} rules)")
    for r in current.rules:
        console.print(f"- {r.name}: {r.pattern} ({r.action}, {r.source})")


@evolve_app.command()
def cycle(
    db: DbOption = TRACE_DB,
    state: StateOption = HOME / "evolve.db",
    memory_path: MemoryOption = HOME / "memory.db",
    tag: TagOption = None,
    env: Annotated[str, typer.Option(help="Rules for: shop, none")] = "shop",
    concurrency: Annotated[int, typer.Option(min=1, max=256)] = 8,
) -> None:
    """collect -> judge -> route -> curate, in one resumable run."""
    source = _source(db)
    grader, rubrics, proposer = _grader_and_rubrics(env)
    report = asyncio.run(
        run_cycle(
            source,
            where=EpisodeFilter(tags=tag or []),
            grader=grader,
            rubrics=rubrics,
            state=EvolveState(state),
            memory=MemoryStore(memory_path),
            proposer=proposer,
            guard_files=GuardRuleFiles(HOME / "guard_rules"),
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


@sdk_cli.bench_app.command("judge")
def bench_judge(
    episodes: Annotated[int, typer.Option(min=10)] = 500,
    latency_s: Annotated[float, typer.Option(min=0.0)] = 0.1,
) -> None:
    """Judge throughput at concurrency 1 and 32 against a 100 ms endpoint."""
    from evoharness.evolve import bench_judge as bench

    bench.run(n=episodes, latency_s=latency_s, echo=console.print)


@app.command()
def demo(
    train_limit: Annotated[int | None, typer.Option(min=1)] = None,
    val_limit: Annotated[int | None, typer.Option(min=1)] = None,
) -> None:
    """The main job: shop val before, train, one evolve cycle, val after (SIMULATED policy)."""
    result = run_demo(
        train_limit=train_limit,
        val_limit=val_limit,
        on_phase=lambda msg: console.print(f"[dim]{msg}[/dim]"),
    )
    table = Table(title="shop · val · offline policy (SIMULATED)")
    table.add_column("metric")
    for p in result.phases:
        table.add_column(p.label, justify="right")
    rows: list[tuple[str, Callable[[Phase], str]]] = [
        ("success rate", lambda p: f"{p.report.success_rate:.1%}"),
        ("mean score", lambda p: f"{p.report.mean_score:.3f}"),
        ("P0 rate (rule judge)", lambda p: f"{p.p0_rate:.1%}"),
        ("tokens / task", lambda p: f"{p.report.mean_tokens:,.0f}"),
        ("model calls / task", lambda p: f"{p.report.mean_model_calls:.1f}"),
        ("crashed runs", lambda p: str(p.report.errors)),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(p) for p in result.phases))
    kinds = sorted({k for p in result.phases for k in p.report.failure_counts})
    for k in kinds:
        table.add_row(
            f"failure: {k}", *(str(p.report.failure_counts.get(k, 0)) for p in result.phases)
        )
    console.print(table)
    c = result.cycle
    console.print(
        f"evolve cycle on the train traces: {c.episodes} episodes judged "
        f"({c.judge.failed} judge failures); routed {c.routed}; memory "
        f"v{c.memory_version}: {c.strategies} strategies, {c.lessons} lessons; "
        f"guard rules v{c.guard_version}"
    )
    console.print("learned (top entries):")
    strategies = [e for e in result.learned if e.kind == "strategy"][:3]
    lessons = [e for e in result.learned if e.kind == "lesson"][:7]
    for e in [*strategies, *lessons]:
        hint = "; ".join(e.avoid_hints) or e.summary
        console.print(
            f"  {escape(f'[{e.kind}]')} ({e.query_pattern}) {escape(hint)}  "
            f"[dim]conf {e.confidence:.2f}, {len(e.references)} traces[/dim]"
        )
    console.print(
        "The offline policy is a simulator whose mistakes drop when a lesson names the step "
        "it skips. This demonstrates the mechanics of the loop, not gains on real models."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``evoharness`` command."""
    return sdk_cli.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
