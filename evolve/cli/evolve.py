"""``evoharness evolve``: judge traces, route cases, curate memory and guard rules."""

from __future__ import annotations

import asyncio
import functools
import os
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Annotated, Any

import typer
from langchain_core.language_models import BaseChatModel
from pydantic import SecretStr
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from evoharness.evolve.cli.options import (
    JudgeKind,
    JudgeModelOption,
    MemoryOption,
    MetaOption,
    PluginEnvOption,
    RejudgeOption,
    SessionOption,
    StateOption,
    TemperatureOption,
    VotesOption,
)
from evoharness.evolve.cli.replay import replay
from evoharness.evolve.cycle import run_cycle, summarize
from evoharness.evolve.environment import (
    EvolveEnvironment,
    build_judge,
    build_proposer,
    build_rubrics,
    load_plugin,
)
from evoharness.evolve.episodes.traces import Episode, EpisodeFilter, LocalTraceSource
from evoharness.evolve.judging.jobs import JudgePool, JudgeReport, judge_episodes, rank_groups
from evoharness.evolve.judging.judge import Judge, LLMJudge, RelativeJudge
from evoharness.evolve.judging.prompts import JUDGE_PROMPT_KIND, JudgePrompts
from evoharness.evolve.judging.rubric import RubricGenerator
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.memory.curation import LLMCurator
from evoharness.evolve.routing.layers import LayerRouting
from evoharness.evolve.routing.pools import route_all
from evoharness.harness import ConfigError
from evoharness.harness.tracing import TraceStore
from evoharness.sdk import cli as sdk_cli
from evoharness.sdk.cli.options import (
    HOME,
    REGISTRY,
    TRACE_DB,
    ApiKeyEnvOption,
    BaseUrlOption,
    ConcurrencyOption,
    RegistryOption,
    TagOption,
    TraceDbOption,
)
from evoharness.sdk.environment import plugin_names
from evoharness.sdk.executors import open_executor
from evoharness.sdk.memory import MemoryStore
from evoharness.sdk.registry import GuardRuleVersions, open_registry

console = sdk_cli.console
app = typer.Typer(
    help="Judge traces, route cases, curate memory and guard rules.", no_args_is_help=True
)
app.command("replay")(replay)  # the P1 replay pool's consumer (evolve/cli/replay.py)


class JudgeSpec:
    """What ``--judge`` and its options asked for (picklable: pool workers rebuild it)."""

    def __init__(
        self,
        kind: str = "rule",
        *,
        model: str | None = None,
        base_url: str | None = None,
        api_key_env: str | None = None,
        votes: int = 3,
        temperature: float = 0.0,
        registry: str | None = None,
    ) -> None:
        if kind not in ("rule", "llm", "relative"):
            raise ConfigError(f"unknown --judge {kind!r}; choose rule, llm or relative")
        if kind != "rule" and not model:
            raise ConfigError(
                f"--judge {kind} needs --judge-model (and --base-url for a local "
                "OpenAI-compatible server)",
                field="judge_model",
            )
        self.kind = kind
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.votes = votes
        self.temperature = temperature
        self.registry = registry

    def prompt(self, name: str) -> tuple[str | None, str | None]:
        """The active ``judge_prompt/<name>`` text and version from the registry (the
        built-in text is published as version 1 the first time)."""
        if self.registry is None:
            return None, None
        with open_registry(self.registry) as registry:
            prompts = JudgePrompts(registry)
            prompts.ensure_defaults()
            return prompts.get(JUDGE_PROMPT_KIND, name)

    def chat_model(self) -> BaseChatModel:
        """The judge model (ChatOpenAI against ``base_url``)."""
        from langchain_openai import ChatOpenAI

        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if self.api_key_env and key is None:
            raise ConfigError(
                f"environment variable {self.api_key_env} is not set; export the judge's API "
                "key there",
                field="api_key_env",
            )
        if key is None:
            key = os.environ.get("OPENAI_API_KEY") or "unused"  # local servers ignore it
        return ChatOpenAI(
            model=str(self.model),
            base_url=self.base_url,
            api_key=SecretStr(key),
            temperature=self.temperature,
            max_retries=1,
        )

    def grader(self, env: EvolveEnvironment) -> Judge:
        """The absolute grader (rules, plus the model with ``--judge llm``)."""
        if self.kind != "llm":
            return build_judge(env)
        text, version = self.prompt("absolute")
        llm = LLMJudge(self.chat_model(), votes=self.votes, prompt=text, prompt_version=version)
        return build_judge(env, llm=llm)

    def ranker(self) -> RelativeJudge | None:
        """The relative judge with ``--judge relative``."""
        if self.kind != "relative":
            return None
        text, version = self.prompt("relative")
        return RelativeJudge(
            self.chat_model(), votes=self.votes, prompt=text, prompt_version=version
        )


def pool_grader(env: str, spec: JudgeSpec) -> Judge:
    """Picklable factory for pool workers: the grader for ``env``."""
    return spec.grader(load_plugin(env))


def pool_rubrics(env: str) -> RubricGenerator:
    """Picklable factory for pool workers: the rubrics for ``env``.

    Without a rubric model there is nothing to cache, so no cache database is opened (a
    ``RubricGenerator`` has no ``close()`` to release one)."""
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
    if not db.exists():
        raise ConfigError(f"no trace store at {db}; run `evoharness run` first or pass --db")
    return TraceStore(db)


def _filter(
    tag: list[str] | None, session: str | None = None, meta: list[str] | None = None
) -> EpisodeFilter:
    pairs: dict[str, Any] = {}
    for m in meta or []:
        key, sep, value = m.partition("=")
        if not sep or not key:
            raise ConfigError(f"bad --meta {m!r}; use KEY=VALUE", field="meta")
        pairs[key] = value
    options: dict[str, Any] = {"tags": tag or []}
    if session is not None:
        options["session_id"] = session
    if pairs:
        options["metadata"] = pairs
    return EpisodeFilter(**options)


def _say_unmatched(plugin: EvolveEnvironment, left_out: int, tags: set[str], total: int) -> None:
    """Say that traces were left out because ``plugin`` does not own them."""
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
def judge(
    db: TraceDbOption = TRACE_DB,
    state: StateOption = HOME / "evolve.db",
    tag: TagOption = None,
    session: SessionOption = None,
    meta: MetaOption = None,
    env: PluginEnvOption = "generic",
    judge_kind: JudgeKind = "rule",
    judge_model: JudgeModelOption = None,
    base_url: BaseUrlOption = None,
    api_key_env: ApiKeyEnvOption = None,
    votes: VotesOption = 3,
    temperature: TemperatureOption = 0.0,
    rejudge: RejudgeOption = False,
    concurrency: ConcurrencyOption = 8,
    workers: Annotated[int, typer.Option(min=1, max=32, help="Parallel workers")] = 1,
    executor: Annotated[
        str,
        typer.Option(help="Where workers run: processes, threads, ray or ray:<address>"),
    ] = "processes",
    registry: RegistryOption = REGISTRY,
) -> None:
    """Judge every trace that needs it (resumable) and write scores back to the store.

    Judged again: traces changed since, and everything judged with another judge or
    rubric version (or all of it with --rejudge). Traces still running wait.
    """
    spec = JudgeSpec(
        judge_kind,
        model=judge_model,
        base_url=base_url,
        api_key_env=api_key_env,
        votes=votes,
        temperature=temperature,
        registry=registry,
    )
    plugin = load_plugin(env)
    with closing(_store(db)) as store:
        _judge(
            LocalTraceSource(store),
            plugin,
            spec,
            env=env,
            state=state,
            db=db,
            where=_filter(tag, session, meta),
            rejudge=rejudge,
            concurrency=concurrency,
            workers=workers,
            executor=executor,
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
) -> None:
    """The judge command's work on an open trace source (the caller closes it)."""
    episodes = _owned(plugin, list(source.episodes(where)))
    _say_other_judges(plugin, episodes)
    if workers > 1 or executor.startswith("ray"):
        with (
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
    else:
        with (
            closing(EvolveState(state)) as st,
            Progress(
                TextColumn("judging"),
                BarColumn(),
                MofNCompleteColumn(),
                console=console,
                transient=True,
            ) as progress,
        ):
            bar = progress.add_task("judge", total=len(episodes))
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
                    on_progress=lambda *_: progress.advance(bar),
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
        _flushed(source)
    console.print(
        f"judged={report.judged} skipped={report.skipped} failed={report.failed} "
        f"running={report.running} repaired={report.repaired} decided={report.decided} "
        f"undecided={report.undecided} good={report.good}"
    )
    _say_generic(plugin, report, {t for e in episodes for t in e.tags})


@app.command()
def route(
    db: TraceDbOption = TRACE_DB,
    state: StateOption = HOME / "evolve.db",
    tag: TagOption = None,
    session: SessionOption = None,
    meta: MetaOption = None,
) -> None:
    """Route judged traces into pools (SFT, strategies, guard, replay, preference, lessons,
    undecided)."""
    with closing(_store(db)) as store, closing(EvolveState(state)) as st:
        episodes = list(LocalTraceSource(store).episodes(_filter(tag, session, meta)))
        added = route_all(episodes, st.verdicts(e.trace_id for e in episodes), st)
        sizes = st.pool_sizes()
    table = Table(title="routed cases")
    table.add_column("pool")
    table.add_column("added", justify="right")
    table.add_column("total", justify="right")
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
    with open_registry(registry) as artifacts, closing(MemoryStore(path, registry=artifacts)) as m:
        _memory(m, action, target, path)


def _memory(store: MemoryStore, action: str, target: str | None, path: Path) -> None:
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
    with open_registry(registry) as artifacts:
        _guard(GuardRuleVersions(artifacts, name), action, target)


def _guard(files: GuardRuleVersions, action: str, target: Path | None) -> None:
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
    db: TraceDbOption = TRACE_DB,
    state: StateOption = HOME / "evolve.db",
    memory_path: MemoryOption = HOME / "memory.db",
    registry: RegistryOption = REGISTRY,
    tag: TagOption = None,
    session: SessionOption = None,
    meta: MetaOption = None,
    env: PluginEnvOption = "generic",
    judge_kind: JudgeKind = "rule",
    judge_model: JudgeModelOption = None,
    base_url: BaseUrlOption = None,
    api_key_env: ApiKeyEnvOption = None,
    votes: VotesOption = 3,
    temperature: TemperatureOption = 0.0,
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
) -> None:
    """collect -> judge -> route -> curate, in one resumable run."""
    if curator not in ("rule", "llm"):
        raise ConfigError(f"unknown --curator {curator!r}; use rule or llm", field="curator")
    if curator == "llm" and not judge_model:
        raise ConfigError(
            "--curator llm needs --judge-model (and --base-url for a local endpoint)",
            field="curator",
        )
    spec = JudgeSpec(
        judge_kind,
        model=judge_model,
        base_url=base_url,
        api_key_env=api_key_env,
        votes=votes,
        temperature=temperature,
        registry=registry,
    )
    plugin = load_plugin(env)
    where = _filter(tag, session, meta)
    with ExitStack() as opened:  # every store closed, also when the cycle fails
        source = LocalTraceSource(opened.enter_context(closing(_store(db))))
        artifacts = opened.enter_context(open_registry(registry))
        report = asyncio.run(
            run_cycle(
                source,
                where=where,
                grader=spec.grader(plugin),
                rubrics=build_rubrics(plugin),
                state=opened.enter_context(closing(EvolveState(state))),
                memory=opened.enter_context(closing(MemoryStore(memory_path, registry=artifacts))),
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
            )
        )
        _flushed(source)
    _say_unmatched(
        plugin, report.unmatched, set(report.unmatched_tags), report.unmatched + report.episodes
    )
    table = Table(title=f"evolve cycle ({plugin.name})")
    table.add_column("what")
    table.add_column("value", justify="right")
    for k, v in summarize(report).items():
        table.add_row(k, str(v))
    console.print(table)
    if report.guard_diff:
        console.print(report.guard_diff)
    _say_generic(plugin, report.judge, set(report.tags))
