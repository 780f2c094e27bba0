"""``evoharness evolve``: judge traces, route cases, curate memory and guard rules."""

from __future__ import annotations

import asyncio
import functools
import re
from collections import Counter
from contextlib import ExitStack, closing
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from evoharness.evolve.cli.options import (
    ALL_TRACES,
    RULES,
    JudgeSpec,
    MemoryOption,
    PluginEnvOption,
    RejudgeOption,
    StateOption,
    Traces,
    VerboseOption,
    judge_options,
    judge_registry,
    trace_options,
)
from evoharness.evolve.cli.replay import replay
from evoharness.harness.errors import ConfigError
from evoharness.sdk import cli as sdk_cli
from evoharness.sdk.cli.console import progress_bar
from evoharness.sdk.cli.options import (
    HOME,
    REGISTRY,
    STAGED,
    TRACE_DB,
    ConcurrencyOption,
    RegistryOption,
    Staging,
    TraceDbOption,
    grouped,
    rollout_options,
)
from evoharness.sdk.cli.stores import opened, trace_store

if TYPE_CHECKING:  # imported where they run: --help and argument errors need none of them
    from evoharness.evolve.environment import EvolveEnvironment
    from evoharness.evolve.episodes.traces import Episode, EpisodeFilter, LocalTraceSource
    from evoharness.evolve.judging.jobs import JudgeReport
    from evoharness.evolve.judging.judge import Judge
    from evoharness.evolve.judging.rubric import RubricGenerator
    from evoharness.evolve.judging.state import EvolveState
    from evoharness.harness.tracing import TraceStore
    from evoharness.sdk.memory import MemoryStore
    from evoharness.sdk.registry import GuardRuleVersions

console = sdk_cli.console
SAMPLE_FAILURES = 3
"""Judge failures printed with their trace ids (``--verbose``: all)."""
app = typer.Typer(
    help="Judge traces, route cases, curate memory and guard rules.", no_args_is_help=True
)
app.command("replay")(replay)  # the P1 replay pool's consumer (evolve/cli/replay.py)


def pool_grader(env: str, spec: JudgeSpec) -> Judge:
    """Picklable factory for pool workers: the grader for ``env``."""
    from evoharness.evolve.environment import load_plugin

    return spec.grader(load_plugin(env))


def pool_rubrics(env: str) -> RubricGenerator:
    """Picklable factory for pool workers: the rubrics for ``env``.

    Without a rubric model there is nothing to cache, so no cache database is opened (a
    ``RubricGenerator`` has no ``close()`` to release one)."""
    from evoharness.evolve.environment import build_rubrics, load_plugin

    return build_rubrics(load_plugin(env))


def _flushed(source: LocalTraceSource) -> None:
    """Wait for the scores to reach the store; say so when they did not in time."""
    if not source.store.flush(30):
        console.print(
            "[yellow]warning: scores still being written after 30 s; they stay queued in the "
            "store's spill file and are written by the next process (evoharness traces "
            "stats)[/yellow]"
        )


def _store(db: Path) -> TraceStore:
    """The trace store at ``db`` (the caller closes it)."""
    return trace_store(db)


def _state(path: Path) -> EvolveState:
    """The evolve state at ``path`` (created when missing; the caller closes it)."""
    from evoharness.evolve.judging.state import EvolveState

    return opened("--state", path, EvolveState)


def _failures(state: EvolveState, failed: list[str], count: int, *, verbose: bool) -> list[str]:
    """Why judging failed, as lines to print: the count, then up to :data:`SAMPLE_FAILURES`
    errors with their trace ids (all with ``verbose``), from the evolve state's error column.
    Errors that differ only in their trace id count as one kind."""
    if not count:
        return []
    errors = [
        (tid, " ".join(j.error.split())) for tid, j in state.lookup(failed).items() if j.error
    ]
    shown = errors if verbose else errors[:SAMPLE_FAILURES]
    kinds = Counter(re.sub(r"\b[0-9a-f]{16,}\b", "<trace>", e)[:90] for _, e in errors)
    common = "; ".join(f"{n}x {k}" for k, n in kinds.most_common(2))
    hidden = len(errors) - len(shown)
    more = f" ({hidden} more: --verbose shows all)" if hidden else ""
    head = f"{count} judge failure(s)" + (f": {common}" if common else "")
    return [head + more, *(f"  {tid}: {error[:300]}" for tid, error in shown)]


def _say(lines: list[str], style: str = "red") -> None:
    for i, line in enumerate(lines):
        console.print(line, markup=False, style=style if i == 0 else None)


def _say_unmatched(plugin: EvolveEnvironment, left_out: int, tags: set[str], total: int) -> None:
    """Say that traces were left out because ``plugin`` does not own them."""
    from evoharness.sdk.environment import plugin_names

    if not left_out:
        return
    known = sorted(tags & set(plugin_names()) - {plugin.name})
    hint = f" (they are tagged {', '.join(known)}: pass --env accordingly)" if known else ""
    console.print(
        f"{left_out} of {total} traces do not belong to environment {plugin.name!r} and "
        f"are left out{hint}; --env generic judges any trace on evidence alone"
    )
    if left_out == total:
        raise ConfigError(
            f"no trace matches environment {plugin.name!r}; pass the environment the traces "
            "came from, or --env generic (an EnvironmentPlugin owns the traces tagged with "
            "its name; give it owns=... to claim others)",
            field="env",
        )


def _owned(plugin: EvolveEnvironment, episodes: list[Episode]) -> list[Episode]:
    """The episodes ``plugin`` owns; says so when some or all are not its traces."""
    kept = [e for e in episodes if plugin.owns(e)]
    ids = {e.trace_id for e in kept}
    left = [e for e in episodes if e.trace_id not in ids]
    _say_unmatched(plugin, len(left), {t for e in left for t in e.tags}, len(episodes))
    return kept


def _say_generic(
    plugin: EvolveEnvironment, report: JudgeReport | None = None, tags: set[str] | None = None
) -> None:
    from evoharness.sdk.environment import plugin_names

    if plugin.checks() or plugin.score_evidence():
        return
    console.print(
        "no checker and no recorded-score mapping: success is decided only by evidence, "
        "so runs are judged failed (evidence) or undecided, never good without evidence"
        + (f" ({report.undecided} undecided)" if report is not None else "")
    )
    known = sorted((tags or set()) & set(plugin_names()))
    if known:
        console.print(
            f"these traces are tagged {', '.join(known)}: --env {known[0]} judges them with "
            "that environment's checker"
        )


def _say_other_judges(plugin: EvolveEnvironment, episodes: list[Episode]) -> None:
    """Say that another environment's judge already scored some of these traces."""
    from evoharness.harness.tracing.provenance import judge_source

    others = sorted({j for e in episodes for j in e.judges if j != plugin.name})
    if others:
        console.print(
            f"these traces also carry scores of the {', '.join(others)} judge: the "
            f"{plugin.name} judge writes its own (source {judge_source(plugin.name)}) and "
            "overwrites none; readers show the judge of the environment a trace is tagged "
            "with (or the one they are given)"
        )


@app.command()
@grouped("traces", trace_options)
@grouped("judging", judge_options)
def judge(
    db: TraceDbOption = TRACE_DB,
    state: StateOption = HOME / "evolve.db",
    traces: Traces = ALL_TRACES,
    env: PluginEnvOption = "generic",
    judging: JudgeSpec = RULES,
    rejudge: RejudgeOption = False,
    concurrency: ConcurrencyOption = 8,
    workers: Annotated[int, typer.Option(min=1, max=32, help="Parallel workers")] = 1,
    executor: Annotated[
        str,
        typer.Option(help="Where workers run: processes, threads, ray or ray:<address>"),
    ] = "processes",
    registry: RegistryOption = REGISTRY,
    verbose: VerboseOption = False,
) -> None:
    """Judge every trace that needs it (resumable) and write scores back to the store.

    Judged again: traces changed since, and everything judged with another judge or
    rubric version (or all of it with --rejudge). Traces still running wait.
    """
    judge_registry(registry)
    kind = executor.partition(":")[0]
    if kind not in ("inline", "threads", "processes", "ray"):
        raise ConfigError(
            f"unknown --executor {executor!r}; use processes, threads, ray or ray:<address>",
            field="executor",
        )
    spec = replace(judging, registry=registry)
    from evoharness.evolve.environment import load_plugin
    from evoharness.evolve.episodes.traces import LocalTraceSource

    with console.status(f"loading environment {env}"):
        plugin = load_plugin(env)
    with closing(_store(db)) as store:
        _judge(
            LocalTraceSource(store),
            plugin,
            spec,
            env=env,
            state=state,
            db=db,
            where=traces.where(),
            rejudge=rejudge,
            concurrency=concurrency,
            workers=workers,
            executor=executor,
            verbose=verbose,
        )


def _judge(
    source: LocalTraceSource,
    plugin: EvolveEnvironment,
    spec: JudgeSpec,
    *,
    env: str,
    state: Path,
    db: Path,
    where: EpisodeFilter,
    rejudge: bool,
    concurrency: int,
    workers: int,
    executor: str,
    verbose: bool = False,
) -> None:
    """The judge command's work on an open trace source (the caller closes it)."""
    from evoharness.evolve.environment import build_rubrics
    from evoharness.evolve.judging.jobs import JudgePool, judge_episodes, rank_groups
    from evoharness.sdk.executors import open_executor

    episodes = _owned(plugin, list(source.episodes(where)))
    _say_other_judges(plugin, episodes)
    if workers > 1 or executor.startswith("ray"):
        with (
            console.status(f"judging {len(episodes)} traces on {workers} {executor} workers"),
            open_executor(executor, workers=workers) as backend,
            JudgePool(
                grader_factory=functools.partial(pool_grader, env, spec),
                rubrics_factory=functools.partial(pool_rubrics, env),
                state_path=state,
                scores_path=db,
                executor=backend,
            ) as pool,
        ):
            report = pool.judge(episodes, concurrency=concurrency, rejudge=rejudge)
        with closing(_state(state)) as st:  # the workers wrote their failures there
            failures = _failures(st, [e.trace_id for e in episodes], report.failed, verbose=verbose)
    else:
        failed: list[str] = []

        def advance(trace_id: str, outcome: str) -> None:
            progress.advance(bar)
            if outcome == "failed":
                failed.append(trace_id)

        with closing(_state(state)) as st, progress_bar() as progress:
            bar = progress.add_task("judging", total=len(episodes))
            ranker = spec.ranker()

            async def judge_then_rank() -> tuple[JudgeReport, JudgeReport | None]:
                # one event loop for both: model clients keep connections per loop
                judged = await judge_episodes(
                    episodes,
                    grader=spec.grader(plugin),
                    rubrics=build_rubrics(plugin),
                    state=st,
                    scores_to=source.store,
                    concurrency=concurrency,
                    rejudge=rejudge,
                    on_progress=advance,
                )
                if ranker is None:
                    return judged, None
                ranked = await rank_groups(
                    episodes, ranker=ranker, state=st, scores_to=source.store
                )
                return judged, ranked

            report, ranked = asyncio.run(judge_then_rank())
            if ranked is not None:
                console.print(f"ranked={ranked.judged} rank_failed={ranked.failed}")
            failures = _failures(st, failed, report.failed, verbose=verbose)
        _flushed(source)
    console.print(
        f"judged={report.judged} skipped={report.skipped} failed={report.failed} "
        f"running={report.running} repaired={report.repaired} decided={report.decided} "
        f"undecided={report.undecided} good={report.good}"
    )
    _say(failures)
    _say_generic(plugin, report, {t for e in episodes for t in e.tags})


@app.command()
@grouped("traces", trace_options)
def route(
    db: TraceDbOption = TRACE_DB,
    state: StateOption = HOME / "evolve.db",
    traces: Traces = ALL_TRACES,
) -> None:
    """Route judged traces into pools (SFT, strategies, guard, replay, preference, lessons,
    undecided)."""
    from evoharness.evolve.episodes.traces import LocalTraceSource
    from evoharness.evolve.routing.pools import route_all

    with closing(_store(db)) as store, closing(_state(state)) as st:
        episodes = list(LocalTraceSource(store).episodes(traces.where()))
        added = route_all(episodes, st.verdicts(e.trace_id for e in episodes), st)
        sizes = st.pool_sizes()
    table = Table(title="routed cases")
    table.add_column("pool")
    table.add_column("added", justify="right")
    table.add_column("total", justify="right")
    for name, n in added.items():
        table.add_row(escape(name), str(n), str(sizes.get(name, 0)))
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
    from evoharness.sdk.registry import open_registry

    with open_registry(registry) as artifacts, closing(_memory_store(path, artifacts)) as m:
        _memory(m, action, target, path)


def _memory_store(path: Path, artifacts: Any, option: str = "--path") -> MemoryStore:
    """The memory store at ``path`` snapshotting into ``artifacts`` (the caller closes it)."""
    from evoharness.sdk.memory import MemoryStore

    return opened(option, path, lambda p: MemoryStore(p, registry=artifacts))


def _memory(store: MemoryStore, action: str, target: str | None, path: Path) -> None:
    if action == "list":
        from evoharness.sdk.memory.entries import scope_label

        table = Table(title=escape(f"memory {path}"))
        for col in ("id", "kind", "pattern", "summary", "conf", "+/-", "refs"):
            table.add_column(col, overflow="fold")
        for e in sorted(store.entries().values(), key=lambda e: (e.kind, e.id)):
            table.add_row(
                escape(e.id),
                escape(e.kind),
                escape(scope_label(e)),
                escape(e.summary),
                f"{e.confidence:.2f}",
                f"{e.helpful}/{e.harmful}",
                str(len(e.references)),
            )
        console.print(table)
    elif action == "versions":
        active = store.active_version()
        versions = store.versions()
        if not versions:
            console.print(f"no memory versions yet in {path}; `evoharness evolve cycle` makes them")
        labels = store.registry.labels("memory", store.name)
        for version, created, note in versions:
            named = sorted(k for k, v in labels.items() if v == version and k != "active")
            mark = (" (active)" if version == active else "") + "".join(f" ({k})" for k in named)
            console.print(f"v{version}{mark}  {_local_time(created)}  {note}", markup=False)
    elif action == "export" and target:
        console.print(f"export: {store.export_json(Path(target))}", markup=False)
    elif action == "import" and target:
        try:
            n = store.import_json(Path(target))
        except (UnicodeDecodeError, ValueError) as exc:  # not JSON, or not memory entries
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(
                f"{target} is not a memory export ({first}); pass a file written by "
                "`evoharness evolve memory export FILE`",
                field="target",
            ) from exc
        console.print(f"import: {n}", markup=False)
    elif action == "restore" and target and target.lstrip("v").isdigit():
        console.print(f"active: v{store.restore(int(target.lstrip('v')))}")
    elif action == "rollback":
        console.print(f"active: v{store.rollback()}")
    else:
        raise ConfigError(
            f"bad memory command {action!r}{f' {target!r}' if target else ''}; use list, "
            "versions, export FILE, import FILE, restore vN or rollback",
            field="action",
        )


def _local_time(at: float) -> str:
    """``at`` (epoch seconds) as ISO local time to the second, with its UTC offset."""
    return datetime.fromtimestamp(at).astimezone().isoformat(sep=" ", timespec="seconds")


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
    from evoharness.sdk.registry import GuardRuleVersions, open_registry

    if not name.strip():
        raise ConfigError("--name is empty; name the rule set (default: default)", field="name")

    with open_registry(registry) as artifacts:
        _guard(GuardRuleVersions(artifacts, name), action, target)


def _guard(files: GuardRuleVersions, action: str, target: Path | None) -> None:
    if action == "rollback":
        console.print(f"now v{files.rollback(reason='cli rollback').version}")
    elif action == "versions":
        versions = files.versions()
        if not versions:
            console.print(
                "no guard rule versions yet; `evoharness evolve cycle` proposes them, or "
                "`evoharness evolve guard import FILE`",
                markup=False,
            )
        active = files.load().version if versions else None
        for v in versions:
            console.print(f"v{v}" + (" (active)" if v == active else ""))
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
        console.print(f"- {r.name}: {r.pattern} ({r.action}, {r.source})", markup=False)


@app.command()
@grouped("traces", trace_options)
@grouped("judging", judge_options)
@grouped("staging", rollout_options)
def cycle(
    db: TraceDbOption = TRACE_DB,
    state: StateOption = HOME / "evolve.db",
    memory_path: MemoryOption = HOME / "memory.db",
    registry: RegistryOption = REGISTRY,
    traces: Traces = ALL_TRACES,
    env: PluginEnvOption = "generic",
    judging: JudgeSpec = RULES,
    rejudge: RejudgeOption = False,
    curator: Annotated[
        str,
        typer.Option(
            help="rule (deterministic proposer) or llm (the --judge-model proposes memory "
            "operations; the rule proposer is its fallback)"
        ),
    ] = "rule",
    since_last: Annotated[
        bool,
        typer.Option(
            "--since-last",
            help="Read only traces written since the last --since-last cycle of this --env",
        ),
    ] = False,
    concurrency: ConcurrencyOption = 8,
    verbose: VerboseOption = False,
    activate: Annotated[
        bool,
        typer.Option(
            "--activate",
            help="Activate the new memory snapshot and guard rules at once (unproven: an "
            "explicit opt-in for demos and tests); default: publish them as candidates, "
            "prove them (paired replay where the environment can, then a staged rollout)",
        ),
    ] = False,
    staging: Staging = STAGED,
    gate_splits: Annotated[
        str,
        typer.Option(
            help="GATE,GUARD[,REPORT] splits of the environment's run side for the paired "
            "offline evaluation of candidates (skipped when it has no run side)"
        ),
    ] = "val,guard,test",
    min_tasks: Annotated[int, typer.Option(min=1, help="Least paired gate tasks")] = 20,
    gate_limit: Annotated[int | None, typer.Option(min=1, help="Most tasks per split")] = None,
    skills: Annotated[
        str | None,
        typer.Option(
            "--skills",
            metavar="NAME",
            help="Also distil the good runs into skills (and workflows proven by replay), "
            "published as skills/NAME and proven like memory; the memory strategies of the "
            "patterns the active skill set covers are retired",
        ),
    ] = None,
) -> None:
    """collect -> judge -> route -> curate -> decide, in one resumable run; new memory,
    guard rules (and with --skills, skills) are published as candidates and proven before
    they go live."""
    from evoharness.evolve.cycle import run_cycle, summarize
    from evoharness.evolve.environment import build_proposer, build_rubrics, load_plugin
    from evoharness.evolve.episodes.traces import LocalTraceSource
    from evoharness.evolve.memory.curation import LLMCurator
    from evoharness.evolve.routing.layers import LayerRouting
    from evoharness.sdk.registry import GuardRuleVersions, open_registry

    if curator not in ("rule", "llm"):
        raise ConfigError(f"unknown --curator {curator!r}; use rule or llm", field="curator")
    if curator == "llm" and not judging.model:
        raise ConfigError(
            "--curator llm needs --judge-model (and --base-url for a local endpoint)",
            field="curator",
        )
    spec = replace(judging, registry=registry)
    promotion = _promotion(activate, staging, gate_splits, min_tasks, gate_limit)
    if skills is not None and not skills.strip():
        raise ConfigError("--skills needs a name, e.g. --skills shop", field="skills")
    with console.status(f"loading environment {env}"):
        plugin = load_plugin(env)
    where = traces.where()
    learning = _skill_learning(plugin, skills) if skills else None
    failed: list[str] = []
    outcomes: Counter[str] = Counter()

    def judged(trace_id: str, outcome: str) -> None:
        outcomes[outcome] += 1
        if outcome == "failed":
            failed.append(trace_id)
        counts = ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
        status.update(f"evolve cycle ({plugin.name}): judging: {counts}")

    with ExitStack() as stack:  # every store closed, also when the cycle fails
        source = LocalTraceSource(stack.enter_context(closing(_store(db))))
        artifacts = stack.enter_context(open_registry(registry))
        st = stack.enter_context(closing(_state(state)))
        status = stack.enter_context(console.status(f"evolve cycle ({plugin.name}): reading"))
        report = asyncio.run(
            run_cycle(
                source,
                where=where,
                grader=spec.grader(plugin),
                rubrics=build_rubrics(plugin),
                state=st,
                memory=stack.enter_context(
                    closing(_memory_store(memory_path, artifacts, "--memory-path"))
                ),
                proposer=(
                    LLMCurator(spec.chat_model(), fallback=build_proposer(plugin))
                    if curator == "llm"
                    else build_proposer(plugin)
                ),
                guard_rules=GuardRuleVersions(artifacts),
                scores_to=source.store,
                concurrency=concurrency,
                rejudge=rejudge,
                owns=plugin.owns,
                since_last=f"cycle:{env}" if since_last else None,
                layers=LayerRouting(env=plugin),
                on_progress=judged,
                on_phase=lambda line: status.update(f"evolve cycle ({plugin.name}): {line}"),
                promotion=promotion,
                replay_env=plugin,
                skills=learning,
            )
        )
        status.stop()
        failures = _failures(st, failed, report.judge.failed, verbose=verbose)
        _flushed(source)
    _say_unmatched(
        plugin, report.unmatched, set(report.unmatched_tags), report.unmatched + report.episodes
    )
    table = Table(title=escape(f"evolve cycle ({plugin.name})"))
    table.add_column("what")
    table.add_column("value", justify="right")
    for k, v in summarize(report).items():
        table.add_row(escape(k), escape(str(v)))
    console.print(table)
    if report.guard_diff:
        console.print(report.guard_diff, markup=False)
    _say(failures)
    _say_decisions(report)
    _say_generic(plugin, report.judge, set(report.tags))


def _skill_learning(plugin: Any, name: str) -> Any:
    """The cycle's skill learning for ``plugin`` into ``skills/<name>``."""
    from evoharness.evolve.environment import lesson_hints_of
    from evoharness.evolve.skills import SkillDistiller
    from evoharness.evolve.skills.learning import SkillLearning

    distiller = SkillDistiller(
        env=plugin.name, case_key=plugin.case_key, hints=lesson_hints_of(plugin)
    )
    return SkillLearning(name=name.strip(), distiller=distiller)


def _promotion(
    activate: bool,
    staging: Staging,
    gate_splits: str,
    min_tasks: int,
    gate_limit: int | None,
) -> Any:
    """The cycle's promotion rule from its options (checked before any work is done)."""
    from evoharness.evolve.promotion import GateConfig, Promotion

    names = [x.strip() for x in gate_splits.split(",") if x.strip()]
    if len(names) not in (2, 3):
        raise ConfigError(
            f"--gate-splits {gate_splits!r}: write GATE,GUARD[,REPORT], e.g. val,guard,test",
            field="gate_splits",
        )
    try:
        gate = GateConfig(
            gate_split=names[0],
            guard_split=names[1],
            report_split=names[2] if len(names) == 3 else None,
            min_tasks=min_tasks,
            limit=gate_limit,
        )
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[-1], field="gate_splits") from exc
    return Promotion(
        activate=activate,
        gate=gate,
        **staging.settings(),
        actor="evoharness evolve cycle",
    )


def _say_decisions(report: Any) -> None:
    """What happened to the candidates, and what the decisions hand to the other layers."""
    for what, got in (("memory", report.memory_promotion), ("guard rules", report.guard_promotion)):
        if got is not None:
            console.print(f"{what} v{got.version}: {got.status}: {escape(got.reason)}")
    hand = {
        "prompt_proposal": "evoharness prompt-evolve propose",
        "training_dataset": "evoharness weights dataset",
        "ops": "evoharness monitor (ops findings)",
    }
    for action, command in hand.items():
        clusters = [d.cluster for d in report.decisions if d.action == action]
        if clusters:
            console.print(
                f"{action}: {escape(', '.join(clusters[:6]))}"
                + (f" (+{len(clusters) - 6} more)" if len(clusters) > 6 else "")
                + f" -> {command}"
            )
