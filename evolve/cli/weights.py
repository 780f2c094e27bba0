"""``evoharness weights``: the weights layer as a product pipeline, for any environment plugin.

``dataset | train | publish | gate | activate`` are the stages of
:class:`~evoharness.evolve.weights.pipeline.WeightsPipeline` over one work directory
(``--workdir``, default ``.evoharness/weights/<policy>``); ``run --stages ...`` runs several
and skips those already done (``state.json`` in the work directory: a killed run resumes);
``status`` and ``rollback`` read and move the registry's labels. The settings given once
(``--env``, ``--base-model``, ``--steps``, the gate's splits, ...) are kept in the work
directory's ``settings.json``, so later stages need not repeat them.

The dataset takes what the last ``evoharness evolve cycle`` decided for training (its
``training_dataset`` clusters) unless told ``--all-episodes``. The gate replays the
plugin's run side: every candidate runs the frozen gate, guard and report splits through the
environment's harness, served by ``--serving`` (default: the CPU pool over ``--base-model``).
Activation is one step: the registry's ``active`` label (or a staged rollout with
``--stages``); sessions behind ``create_evo_agent(adapter=..., serving=...)`` load the new
version, then are served by it.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from evoharness.evolve.cli.options import StateOption
from evoharness.harness.errors import ConfigError
from evoharness.sdk import cli as sdk_cli
from evoharness.sdk.cli.console import progress_bar
from evoharness.sdk.cli.options import (
    HOME,
    REGISTRY,
    TRACE_DB,
    ActorOption,
    MinDwellOption,
    ReasonOption,
    RegistryOption,
    StagesOption,
    TagOption,
    TraceDbOption,
    check_number,
    grouped,
    non_empty,
)

if TYPE_CHECKING:
    from rich.progress import Progress

console = sdk_cli.console
app = typer.Typer(
    help="The weights layer: dataset -> train -> publish -> gate -> activate (resumable), "
    "status, rollback.",
    no_args_is_help=True,
)

Policy = Annotated[
    str, typer.Option(callback=non_empty, help="The adapter artifact (versions <policy>-vN).")
]
Env = Annotated[
    str | None,
    typer.Option(
        "--env",
        help="Environment plugin (a registered name or package.module:Object): its case key "
        "selects the decided clusters' runs, its run side replays the gate's splits.",
    ),
]
Workdir = Annotated[
    Path | None,
    typer.Option(help="The pipeline's work directory (default .evoharness/weights/<policy>)."),
]
BaseModel_ = Annotated[
    str | None, typer.Option("--base-model", help="smollm2, qwen2.5-coder-0.5b or a model dir.")
]
Steps = Annotated[int | None, typer.Option(min=1, help="SFT optimizer steps.")]
DpoSteps = Annotated[int | None, typer.Option(min=0, help="DPO steps on SFT (0: no DPO).")]
LearningRate = Annotated[float | None, typer.Option("--lr", min=1e-12, help="SFT learning rate.")]
MaxLength = Annotated[int | None, typer.Option(min=16, help="Longest tokenised row.")]
LoraR = Annotated[int | None, typer.Option("--lora-r", min=1, max=16, help="LoRA rank.")]
AllEpisodes = Annotated[
    bool,
    typer.Option(
        "--all-episodes",
        help="Build from every episode --tag selects, not only the clusters the last cycle "
        "decided for training.",
    ),
]
Split = Annotated[str | None, typer.Option(help="A split of the environment's run side.")]
MinTasks = Annotated[int | None, typer.Option(min=1, help="Least paired gate tasks.")]
Limit = Annotated[int | None, typer.Option(min=1, help="Most tasks per split.")]
Alpha = Annotated[float | None, typer.Option(min=0.0001, max=0.5, help="Gate significance.")]
Serving = Annotated[
    str | None,
    typer.Option(
        help="package.module:factory returning an AdapterServer (load + chat_model) for the "
        "gate; default: the CPU pool over --base-model."
    ),
]
MaxNewTokens = Annotated[int | None, typer.Option(min=1, help="Completion budget per call.")]
Redo = Annotated[list[str] | None, typer.Option(help="Run this stage (and later ones) again.")]
Rollout = Annotated[
    bool,
    typer.Option(
        "--rollout/--direct",
        help="Go live through a staged rollout of the adapter (--stages, sticky by user, "
        "guard rollback) or at once (--direct, after the gate).",
    ),
]

DEFAULTS: dict[str, Any] = {
    "env": "generic",
    "base_model": None,
    "steps": 32,
    "dpo_steps": 0,
    "lr": 2e-4,
    "max_length": 2048,
    "lora_r": 16,
    "gate_split": "val",
    "guard_split": "guard",
    "report_split": "test",
    "min_tasks": 20,
    "limit": None,
    "alpha": 0.05,
    "serving": None,
    "max_new_tokens": 256,
    "tags": [],
    "decisions": "default",
}


NUMBERS: dict[str, Any] = {
    "steps": Steps, "dpo_steps": DpoSteps, "lr": LearningRate, "max_length": MaxLength,
    "lora_r": LoraR, "min_tasks": MinTasks, "limit": Limit, "alpha": Alpha,
    "max_new_tokens": MaxNewTokens,
}  # fmt: skip
"""The numeric settings, by the option that sets them (its type and bounds hold for
``--set`` too)."""


def _number(key: str, text: str) -> int | float:
    """``text`` as the setting ``key``, typed and bounded as its option is."""
    optional, info = typing.get_args(NUMBERS[key])
    kind = next(t for t in typing.get_args(optional) if t is not type(None))
    try:
        value: int | float = kind(text)
    except ValueError as exc:
        raise ConfigError(f"--set {key}={text}: {key} is a number", field="set") from exc
    decls = [d for d in (info.default, *(info.param_decls or ())) if isinstance(d, str)]
    flag = decls[0] if decls else "--" + key.replace("_", "-")
    check_number(f"--set {key}={text}: {key} (as {flag})", value, info)
    return value


def _workdir(policy: str, workdir: Path | None) -> Path:
    work = workdir if workdir is not None else HOME / "weights" / policy
    if work.exists() and not work.is_dir():
        raise ConfigError(f"--workdir {work} is a file; pass a folder", field="workdir")
    return work


@dataclass(frozen=True)
class _Target:
    """The adapter a command works on (``--policy``), its work directory (``--workdir``)
    and the registry it is published in (``--registry``)."""

    policy: str = "policy"
    workdir: Path | None = None
    registry: str = REGISTRY

    @property
    def work(self) -> Path:
        """The work directory (checked: not a file)."""
        return _workdir(self.policy, self.workdir)


POLICY = _Target()
"""The default of a command's ``target`` (typer never reads it: the options stand in)."""


def _target(
    policy: Policy = "policy", workdir: Workdir = None, registry: RegistryOption = REGISTRY
) -> _Target:
    """The options naming what a stage command works on, one group."""
    return _Target(policy, workdir, registry)


@dataclass(frozen=True)
class _Dataset:
    """What a command that builds the dataset reads: the target, the trace store and the
    evolve state, and the settings it was given (``--env``, ``--tag``, ``--base-model``)."""

    target: _Target = POLICY
    db: Path = TRACE_DB
    state: Path = HOME / "evolve.db"
    given: dict[str, Any] = dataclass_field(default_factory=dict)
    all_episodes: bool = False


SOURCE = _Dataset()
"""The default of a command's ``source`` (typer never reads it: the options stand in)."""


def _dataset(
    policy: Policy = "policy",
    workdir: Workdir = None,
    db: TraceDbOption = TRACE_DB,
    state: StateOption = HOME / "evolve.db",
    registry: RegistryOption = REGISTRY,
    env: Env = None,
    tag: TagOption = None,
    base_model: BaseModel_ = None,
    all_episodes: AllEpisodes = False,
) -> _Dataset:
    """The options of the commands that build the dataset (``dataset``, ``run``), one
    group."""
    given = _given(env=env, tags=tag, base_model=base_model)
    return _Dataset(_Target(policy, workdir, registry), db, state, given, all_episodes)


def _settings(work: Path, given: dict[str, Any]) -> dict[str, Any]:
    """The work directory's settings with what this command was given on top (kept once
    they make a valid configuration)."""
    path = work / "settings.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    merged = {**DEFAULTS, **kept, **{k: v for k, v in given.items() if v not in (None, [])}}
    if merged["base_model"]:
        _layer_config("check", merged)
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=1, sort_keys=True))
    return merged


class _Bars:
    """One Rich progress bar per thing the pipeline reports (training steps, evaluations)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, Any] = {}

    def __call__(self, what: str, done: int, total: int) -> None:
        task = self.tasks.get(what)
        if task is None:
            task = self.tasks[what] = self.progress.add_task(what, total=total)
        self.progress.update(task, completed=done, total=total)


def _say(line: str) -> None:
    console.print(escape(line))


def _gate_config(s: dict[str, Any]) -> Any:
    from evoharness.evolve.promotion import GateConfig

    try:
        return GateConfig(
            gate_split=s["gate_split"],
            guard_split=s["guard_split"],
            report_split=s["report_split"] or None,
            alpha=s["alpha"],
            min_tasks=s["min_tasks"],
            limit=s["limit"],
        )
    except ValueError as exc:
        raise ConfigError(str(exc).splitlines()[-1], field="gate_split") from exc


def _layer_config(policy: str, s: dict[str, Any]) -> Any:
    from evoharness.evolve.episodes.traces import EpisodeFilter
    from evoharness.evolve.weights.config import DPORunConfig, LoRASpec, SFTRunConfig
    from evoharness.evolve.weights.pipeline import WeightsLayerConfig

    base = s["base_model"]
    if not base:
        raise ConfigError(
            "the weights pipeline needs --base-model (smollm2, qwen2.5-coder-0.5b or a local "
            "model directory); it is kept for the later stages",
            field="base_model",
        )
    common: dict[str, Any] = {
        "base_model": base,
        "max_length": s["max_length"],
        "lora": LoRASpec(r=s["lora_r"], alpha=2 * s["lora_r"]),
    }
    dpo = (
        DPORunConfig(max_steps=s["dpo_steps"], save_steps=s["dpo_steps"], **common)
        if s["dpo_steps"]
        else None
    )
    gate = _gate_config(s)
    return WeightsLayerConfig(
        policy=policy,
        sft=SFTRunConfig(
            max_steps=s["steps"],
            learning_rate=s["lr"],
            save_steps=max(1, min(8, s["steps"])),
            drop_overlong=True,
            **common,
        ),
        dpo=dpo,
        where=EpisodeFilter(tags=s["tags"]),
        alpha=gate.alpha,
        min_tasks=gate.min_tasks,
    )


def _server(s: dict[str, Any]) -> Any:
    from evoharness.evolve.weights.replay import LocalAdapterServer

    spec = s["serving"]
    if not spec:
        return LocalAdapterServer(s["base_model"], max_new_tokens=s["max_new_tokens"])
    from evoharness.sdk.environment import resolve_plugin

    made = resolve_plugin(spec)
    server = made() if callable(made) and not hasattr(made, "chat_model") else made
    if not (hasattr(server, "load") and hasattr(server, "chat_model")):
        raise ConfigError(
            f"--serving {spec!r} gave {type(server).__name__}, not an AdapterServer (it needs "
            "load(name, path) and chat_model(name))",
            field="serving",
        )
    return server


@contextmanager
def _pipeline(
    target: _Target,
    given: dict[str, Any] | None = None,
    *,
    source: _Dataset | None = None,
) -> Iterator[Any]:
    """The pipeline of the target's policy with its stores open (closed afterwards); with
    ``source``, over the traces it names (the dataset stage needs them)."""
    from evoharness.evolve.environment import load_plugin
    from evoharness.evolve.weights.pipeline import WeightsPipeline
    from evoharness.sdk.registry import open_registry

    policy, work = target.policy, target.work
    s = _settings(work, given or {})
    plugin = load_plugin(s["env"])
    with ExitStack() as stack:
        reg = stack.enter_context(open_registry(target.registry))
        traces = verdicts = tools = selection = None
        if source is not None:
            traces, verdicts, tools, selection = _dataset_inputs(
                stack, plugin, reg, source.db, source.state, s, source.all_episodes
            )
        runtime = plugin.runtime()
        evaluate = None
        if runtime is not None:
            from evoharness.evolve.weights.replay import replay_evaluation

            served: list[Any] = []  # one server (one base model in memory) per command

            def evaluate(candidate: Any) -> Any:
                if not served:
                    served.append(
                        replay_evaluation(plugin, runtime, _server(s), gate=_gate_config(s))
                    )
                return served[0](candidate)

        yield WeightsPipeline(
            traces,
            config=_layer_config(policy, s),
            registry=reg,
            workdir=work,
            evaluate=evaluate,
            tools=tools,
            verdicts=verdicts,
            selection=selection,
            case_key=plugin.case_key,
            actor="evoharness weights",
            log=_say,
            progress=stack.enter_context(_bars()),
        )


@contextmanager
def _bars() -> Iterator[_Bars]:
    with progress_bar("{task.description}") as progress:
        yield _Bars(progress)


def _dataset_inputs(
    stack: ExitStack,
    plugin: Any,
    reg: Any,
    db: Path,
    state: Path,
    s: dict[str, Any],
    all_episodes: bool,
) -> tuple[Any, Any, Any, Any]:
    """The trace source, verdicts, tool schemas and the cycle's training selection."""
    from evoharness.evolve.episodes.traces import LocalTraceSource
    from evoharness.evolve.judging.state import EvolveState
    from evoharness.evolve.routing.layers import decided, latest_decisions
    from evoharness.evolve.weights.datasets import tool_schemas
    from evoharness.evolve.weights.pipeline import Selection
    from evoharness.harness.tracing import TraceStore

    if not db.exists():
        raise ConfigError(f"no trace store at {db}; pass --db", field="db")
    store = stack.enter_context(closing(TraceStore(db)))
    verdicts = None
    if state.exists():
        verdicts = stack.enter_context(closing(EvolveState(state))).verdicts()
    runtime = plugin.runtime()
    tools = None
    if runtime is not None:
        first = next(iter(runtime.tasks(s["gate_split"])), None)
        tools = tool_schemas(runtime.tools_for(first)) if first is not None else None
    selection = None
    if not all_episodes:
        chosen = decided(latest_decisions(reg, s["decisions"]), "training_dataset")
        if not chosen:
            raise ConfigError(
                "the last evolve cycle decided no cluster for training (no training_dataset "
                "decision in layer_decisions/" + s["decisions"] + "): run evoharness evolve "
                "cycle first, or pass --all-episodes to train on every episode --tag selects",
                field="all_episodes",
            )
        selection = Selection(
            patterns=sorted({d.pattern for d in chosen}),
            trace_ids=sorted({t for d in chosen for t in d.trace_ids}),
            clusters=[d.cluster for d in chosen],
        )
        console.print(
            f"training selection: {len(chosen)} cluster(s) the cycle decided: "
            + escape(", ".join(selection.clusters))
        )
    return LocalTraceSource(store), verdicts, tools, selection


def _given(**values: Any) -> dict[str, Any]:
    return values


@app.command("dataset")
@grouped("source", _dataset)
def dataset(source: _Dataset = SOURCE) -> None:
    """Build the SFT (and DPO) datasets from the traces: the clusters the last cycle decided
    for training (or --all-episodes). Runs again when asked: later stages then run again."""
    with _pipeline(source.target, source.given, source=source) as p:
        p.dataset()


@app.command("train")
@grouped("target", _target)
def train_cmd(
    target: _Target = POLICY,
    base_model: BaseModel_ = None,
    steps: Steps = None,
    dpo_steps: DpoSteps = None,
    lr: LearningRate = None,
    max_length: MaxLength = None,
    lora_r: LoraR = None,
) -> None:
    """Train LoRA SFT on the dataset (DPO on top with --dpo-steps); resumes a killed run."""
    given = _given(
        base_model=base_model, steps=steps, dpo_steps=dpo_steps, lr=lr, max_length=max_length,
        lora_r=lora_r,
    )  # fmt: skip
    with _pipeline(target, given) as p:
        p.train()


@app.command("publish")
@grouped("target", _target)
def publish(target: _Target = POLICY) -> None:
    """Publish each trained adapter as an immutable registry version <policy>-vN."""
    with _pipeline(target) as p:
        p.publish()


@app.command("gate")
@grouped("target", _target)
def gate(
    target: _Target = POLICY,
    env: Env = None,
    gate_split: Split = None,
    guard_split: Split = None,
    report_split: Split = None,
    min_tasks: MinTasks = None,
    limit: Limit = None,
    alpha: Alpha = None,
    serving: Serving = None,
    max_new_tokens: MaxNewTokens = None,
) -> None:
    """Paired offline gate: the baseline and each adapter replay the environment's frozen
    gate, guard and report splits; exact McNemar with a minimum sample on the gate split,
    zero new P0 on the guard split. Passing: label candidate; else recorded as rejected."""
    given = _given(
        env=env, gate_split=gate_split, guard_split=guard_split, report_split=report_split,
        min_tasks=min_tasks, limit=limit, alpha=alpha, serving=serving,
        max_new_tokens=max_new_tokens,
    )  # fmt: skip
    with _pipeline(target, given) as p:
        if p.evaluate is None:
            raise ConfigError(
                "the environment has no run side to replay, so no offline gate can run: "
                "prove the published adapter with a staged rollout instead (evoharness "
                f"rollout start adapter {target.policy} VERSION)",
                field="env",
            )
        record = p.gate()
    _print_gate(record)


def _print_gate(record: dict[str, Any]) -> None:
    for stage in ("sft", "dpo"):
        if stage in record:
            console.print(
                f"{stage} v{record[stage]['version']}: " + escape(record[stage]["gate"]["reason"])
            )


@app.command("activate")
@grouped("target", _target)
def activate_cmd(
    target: _Target = POLICY,
    rollout: Rollout = False,
    stages: StagesOption = "0.1,0.3,1.0",
    min_dwell_s: MinDwellOption = 3600.0,
    dpo: Annotated[bool, typer.Option(help="Activate the DPO adapter (when it passed).")] = False,
) -> None:
    """Make the gated adapter live: the registry's active label (serving loads it before
    routing sessions to it), or a staged rollout with --rollout. Only a version that passed
    the gate; never a rejected one."""
    from evoharness.sdk.rollout import parse_stages

    traffic = parse_stages(stages)  # checked even when going live at once
    with _pipeline(target) as p:
        p.forget("activate")
        record = p.activate(
            stages={"dpo"} if dpo else {"sft"},
            rollout=traffic if rollout else None,
            min_dwell_s=min_dwell_s,
        )
    if not any(r.get("status") in ("active", "rollout") for r in record.values()):
        raise ConfigError(
            f"nothing activated: the gate did not pass ({record or 'no gated adapter'}); see "
            "evoharness weights status",
            field="policy",
        )


def _set(items: list[str] | None) -> dict[str, Any]:
    """``--set steps=4 --set min_tasks=12`` -> settings (typed like their defaults)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in DEFAULTS or key in ("tags",):
            raise ConfigError(
                f"--set {item!r}: write KEY=VALUE with KEY one of "
                f"{', '.join(k for k in DEFAULTS if k != 'tags')}",
                field="set",
            )
        out[key] = _number(key, value) if key in NUMBERS else value
    return out


@app.command("run")
@grouped("source", _dataset)
def run(
    stages: Annotated[
        list[str] | None,
        typer.Argument(help="Stages to run, in order (default: all five)."),
    ] = None,
    source: _Dataset = SOURCE,
    redo: Redo = None,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="KEY=VALUE for any setting the stage commands take (steps=4, min_tasks=12, "
            "gate_split=val, serving=pkg.mod:factory, ...); kept in the work directory.",
        ),
    ] = None,
) -> None:
    """Run several stages in order; a stage already done in the work directory is skipped
    (--redo STAGE runs it and the later ones again)."""
    from evoharness.evolve.weights.pipeline import STAGES, load_state

    chosen = [x for s in stages or STAGES for x in s.split(",") if x]
    for field, named in (("stages", chosen), ("redo", redo or [])):
        unknown = sorted(set(named) - set(STAGES))
        if unknown:
            raise ConfigError(
                f"unknown weights stage(s) {unknown}: choose from {', '.join(STAGES)}",
                field=field,
            )
    done = load_state(source.target.work).get("done", {})
    build = "dataset" in chosen and ("dataset" not in done or bool(redo))
    given = {**_set(settings), **source.given}
    with _pipeline(source.target, given, source=source if build else None) as p:
        skipped = p.run(chosen, redo=redo or (), rollout=None)
    if skipped:
        console.print(f"skipped (done before): {', '.join(skipped)}")


@app.command("status")
@grouped("target", _target)
def status_cmd(target: _Target = POLICY) -> None:
    """Adapter versions (active, candidate, rejected, published), the running rollout, and
    the stages done in the work directory."""
    from evoharness.evolve.weights.pipeline import STAGES, load_state
    from evoharness.evolve.weights.versions import KIND, served_name, status
    from evoharness.sdk.registry import open_registry
    from evoharness.sdk.rollout import RolloutController

    policy = target.policy
    with open_registry(target.registry) as reg:
        console.print(f"adapter/{policy}: labels {reg.labels(KIND, policy)}", markup=False)
        reasons = {e.version: e.reason for e in reg.events(KIND, policy) if e.action == "label"}
        for v in reg.versions(KIND, policy):
            console.print(
                f"  {served_name(v)}  {status(reg, policy, v.version)}  base "
                f"{v.content.get('base_model')}  by {v.author}  {reasons.get(v.version, '')}",
                markup=False,
                soft_wrap=True,
            )
        exp = RolloutController(reg).running(policy, kind=KIND)
        if exp is not None:
            arms = ", ".join(f"{a.name}=v{a.version}" for a in [exp.control, *exp.candidates])
            console.print(f"rollout {exp.id}: stage {exp.stage + 1}/{len(exp.stages)}, {arms}")
    done = load_state(target.work).get("done", {})
    console.print("stages done: " + (", ".join(s for s in STAGES if s in done) or "none"))


@app.command("rollback")
def rollback_cmd(
    policy: Policy = "policy",
    registry: RegistryOption = REGISTRY,
    reason: ReasonOption = "manual rollback",
    actor: ActorOption = "cli",
) -> None:
    """Serve the adapter version active before (or end its running rollout): new sessions
    get it at once; running sessions keep theirs."""
    from evoharness.evolve.weights.versions import KIND
    from evoharness.sdk.registry import open_registry
    from evoharness.sdk.rollout import RolloutController

    with open_registry(registry) as reg:
        d = RolloutController(reg).rollback(policy, kind=KIND, reason=reason, actor=actor)
        now = reg.labels(KIND, policy).get("active")
    console.print(
        escape(f"adapter/{policy}: {d.reason}; active is " + (f"v{now}" if now else "the base"))
    )
