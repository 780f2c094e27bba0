"""``evoharness prompt-evolve propose|evaluate``: the prompt layer from the command line.

(Mounted as ``prompt-evolve`` because ``evolve`` is the memory layer's group.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from evoharness.evolve.cli.options import StateOption
from evoharness.harness.errors import ConfigError
from evoharness.sdk import cli as sdk_cli
from evoharness.sdk.cli.options import (
    HOME,
    REGISTRY,
    STAGED,
    ApiKeyEnvOption,
    BaseUrlOption,
    EnvOption,
    EvalDbOption,
    RegistryOption,
    Staging,
    TaskLimitOption,
    TraceDbOption,
    grouped,
    rollout_options,
)
from evoharness.sdk.cli.stores import opened, sqlite_file

if TYPE_CHECKING:  # imported where they run: --help and argument errors need none of them
    from evoharness.evolve.prompting import PromptLayerReport, Proposal

console = sdk_cli.console
app = typer.Typer(
    help="Prompt layer: propose prompt edits from bad-case clusters, gate them, evaluate "
    "them paired against the active version, hand accepted ones to the rollout.",
    no_args_is_help=True,
)
Prompt = Annotated[str | None, typer.Option(help="Prompt name (default: the environment's)")]
Results = Annotated[Path, typer.Option(help="Resumable store of finished evaluation runs")]
Memory = Annotated[
    str | None,
    typer.Option(
        metavar="NAME",
        help="Serve memory/NAME's active snapshot (in --registry) to every run, both arms",
    ),
]
ValSplit = Annotated[str, typer.Option(help="Frozen validation split")]
GuardSplit = Annotated[str, typer.Option(help="Guard split (no P0 regression allowed)")]
Seed = Annotated[int, typer.Option(help="Environment seed (the same faults for both arms)")]


def _stores(*, db: Path, eval_db: Path | None) -> None:
    """The stores the evaluation opens later, checked before any work: SQLite files or
    none yet."""
    for option, path in (("--db", db), ("--eval-db", eval_db)):
        sqlite_file(option, path)


def _memory(registry: Any, name: str | None) -> Any:
    """The pinned snapshot of ``--memory NAME`` (``None`` without the option)."""
    from evoharness.evolve.prompting.evaluation import pin_memory

    if name is None:
        return None
    pin = pin_memory(registry, name)
    if pin is None:
        raise ConfigError(
            f"--memory {name}: memory/{name} has no active snapshot in the registry (run "
            "evoharness evolve cycle first, or pass the --registry it published to)",
            field="memory",
        )
    return pin


def _options(seed: int) -> dict[str, Any]:
    return {"seed": seed} if seed else {}


def _ids(env: str, split: str, limit: int | None, seed: int, skip: set[str]) -> list[str]:
    from evoharness.evolve.environment import load_plugin, runtime_of

    world = runtime_of(load_plugin(env), **_options(seed))
    ids = [t.task_id for t in world.tasks(split) if t.task_id not in skip]
    return ids[:limit] if limit else ids


def _reflection(
    reflector: str, model: str | None, base_url: str | None, key_env: str | None
) -> Any:
    from evoharness.evolve.prompting import SimulatedReflector

    if reflector == "simulated":
        return SimulatedReflector(), None
    if reflector != "llm" or not model:
        raise ConfigError(
            "--reflector llm needs --model (and --base-url for an OpenAI-compatible server); "
            "--reflector simulated is the offline SIMULATOR",
            field="reflector",
        )
    from langchain_openai import ChatOpenAI

    key = os.environ.get(key_env) if key_env else None
    chat = ChatOpenAI(model=model, base_url=base_url, api_key=key or "not-needed")
    return None, chat


def _print(report: PromptLayerReport) -> None:
    console.print(
        f"prompt {report.prompt}: active v{report.active}; "
        f"{len(report.clusters)} cluster(s): "
        + ", ".join(f"{c.key} ({c.size})" for c in report.clusters),
        markup=False,
    )
    if report.note:
        console.print(report.note, markup=False)
    for p in report.proposals:
        _proposal(p)


def _proposal(p: Proposal) -> None:
    v = f"v{p.version}" if p.version is not None else "-"
    console.print(f"[bold]{escape(p.status)}[/bold] {v}: {escape(p.reason)}")
    for r in p.rules:
        console.print(f"  + {escape(r)}")
    if p.evaluation is not None:
        e = p.evaluation
        console.print(
            f"  val {e.val.control_success:.3f} -> {e.val.candidate_success:.3f} "
            f"(+{e.val.wins}/-{e.val.losses}, p={e.val.p_value:.4f}); runs {e.ran} new, "
            f"{e.reused} resumed"
        )
    if p.experiment_id:
        console.print(f"  rollout {p.experiment_id} started at stage one", markup=False)


@app.command("propose")
@grouped("staging", rollout_options)
def propose(
    env: EnvOption = "shop",
    prompt: Prompt = None,
    registry: RegistryOption = REGISTRY,
    state: StateOption = HOME / "evolve.db",
    results: Results = HOME / "prompt-eval.db",
    db: TraceDbOption = HOME / "traces.db",
    eval_db: EvalDbOption = None,
    memory: Memory = None,
    search: Annotated[str, typer.Option(help="gepa or direct")] = "gepa",
    reflector: Annotated[str, typer.Option(help="simulated (offline SIMULATOR) or llm")] = (
        "simulated"
    ),
    model: Annotated[str | None, typer.Option(help="Reflection model (--reflector llm)")] = None,
    base_url: BaseUrlOption = None,
    api_key_env: ApiKeyEnvOption = None,
    budget: Annotated[int, typer.Option(min=1, help="GEPA rollout budget")] = 60,
    search_split: Annotated[str, typer.Option(help="Split of the bad cases' tasks")] = "train",
    val_split: ValSplit = "val",
    val_limit: TaskLimitOption = None,
    guard_split: GuardSplit = "train",
    guard_limit: Annotated[int, typer.Option(min=1, help="Guard tasks")] = 40,
    seed: Seed = 0,
    evaluate: Annotated[
        bool, typer.Option(help="Also evaluate and hand off (--no-evaluate: draft only)")
    ] = True,
    staging: Staging = STAGED,
    decisions_name: Annotated[
        str,
        typer.Option(
            "--decisions",
            help="The cycle's layer decisions to follow (layer_decisions/<name>, the memory "
            "name): only the clusters decided for the prompt layer are proposed on",
        ),
    ] = "default",
) -> None:
    """Propose a prompt edit for the clusters the last evolve cycle decided for the prompt
    layer (never one memory fixed), gate it, and (by default) evaluate it paired and hand an
    accepted one to the rollout (--stages, --min-dwell-s, --tolerance)."""
    from evoharness.evolve.environment import load_plugin
    from evoharness.evolve.judging.state import EvolveState
    from evoharness.evolve.prompting import (
        EvalResults,
        PromptLayerConfig,
        ensure_prompt,
        run_prompt_layer,
    )
    from evoharness.evolve.routing.layers import latest_decisions, prompt_clusters
    from evoharness.harness.tracing.provenance import eval_store_path
    from evoharness.sdk.registry import open_registry
    from evoharness.sdk.session import PROMPT

    _stores(db=db, eval_db=eval_db)
    if search not in ("gepa", "direct"):
        raise ConfigError(f"unknown --search {search!r}; use gepa or direct", field="search")
    if model is not None and not model.strip():
        raise ConfigError("--model is empty; name the reflection model", field="model")
    reflect, chat = _reflection(reflector, model, base_url, api_key_env)
    name = prompt or env
    reg = open_registry(registry)
    try:
        st = opened("--state", state, EvolveState)
    except BaseException:
        reg.close()
        raise
    try:
        packages = st.pool("lesson_candidate")
        decisions = latest_decisions(reg, decisions_name)
        if not decisions:
            console.print("no layer decisions recorded yet: proposing on every bad-case cluster")
        world = load_plugin(env).runtime(**_options(seed))
        if world is not None:
            ensure_prompt(reg, name, world.system_prompt())
        elif reg.labels(PROMPT, name).get("active") is None:
            raise ConfigError(
                f"prompt {name!r} has no active version, and environment {env!r} has no run "
                "side to import one from: publish the app's prompt first (evoharness prompts "
                f"create {name} --file PROMPT.txt --activate)",
                field="prompt",
            )
        search_ids = {str((p.get("metadata") or {}).get("task_id")) for p in packages}
        report = run_prompt_layer(
            registry=reg,
            prompt=name,
            env=env,
            packages=packages,
            val=(val_split, _ids(env, val_split, val_limit, seed, set()) if world else []),
            guard=(
                guard_split,
                _ids(env, guard_split, guard_limit, seed, search_ids) if world else [],
            ),
            results=opened("--results", results, EvalResults),
            search_split=search_split,
            reflector=reflect,
            reflection_model=chat,
            env_options=_options(seed),
            trace_db=eval_db or eval_store_path(db),
            memory=_memory(reg, memory),
            decided=prompt_clusters(decisions) if decisions else None,
            config=PromptLayerConfig(search=search, search_budget=budget, **staging.settings()),
            evaluate=evaluate,
        )
        _print(report)
    finally:
        st.close()
        reg.close()


@app.command("evaluate")
@grouped("staging", rollout_options)
def evaluate(
    candidate: Annotated[int, typer.Argument(min=1, help="Candidate version")],
    env: EnvOption = "shop",
    prompt: Prompt = None,
    registry: RegistryOption = REGISTRY,
    results: Results = HOME / "prompt-eval.db",
    db: TraceDbOption = HOME / "traces.db",
    eval_db: EvalDbOption = None,
    memory: Memory = None,
    val_split: ValSplit = "val",
    val_limit: TaskLimitOption = None,
    guard_split: GuardSplit = "train",
    guard_limit: Annotated[int, typer.Option(min=1, help="Guard tasks")] = 40,
    alpha: Annotated[float, typer.Option(min=0.0001, max=0.5)] = 0.05,
    seed: Seed = 0,
    handoff: Annotated[bool, typer.Option(help="Start the rollout when accepted")] = True,
    staging: Staging = STAGED,
) -> None:
    """Paired evaluation of CANDIDATE against the active version (resumable: rerun after
    a crash and only the missing runs run); accepted -> rollout stage one."""
    from evoharness.evolve.environment import load_plugin
    from evoharness.evolve.prompting import (
        EvalResults,
        PairedEvaluation,
        PromptLayerConfig,
        Proposal,
    )
    from evoharness.evolve.prompting.layer import hand_off, record_proposal
    from evoharness.harness.tracing.provenance import eval_store_path
    from evoharness.sdk.prompts import RegistryPromptStore
    from evoharness.sdk.registry import open_registry

    _stores(db=db, eval_db=eval_db)
    with console.status(f"loading environment {env}"):
        load_plugin(env)  # a broken --env is refused before the registry is read
    name = prompt or env
    reg = open_registry(registry)
    try:
        store = RegistryPromptStore(reg)
        active = store.get(name)
        cand = store.get(name, candidate)
        ev = PairedEvaluation(
            env,
            opened("--results", results, EvalResults),
            env_options=_options(seed),
            trace_db=eval_db or eval_store_path(db),
            memory=_memory(reg, memory),
            alpha=alpha,
        )
        paired = ev.run(
            name,
            (active.version, active.render()),
            (cand.version, cand.render()),
            val=(val_split, _ids(env, val_split, val_limit, seed, set())),
            guard=(guard_split, _ids(env, guard_split, guard_limit, seed, set())),
        )
        p = Proposal(
            clusters=[],
            rules=[],
            status="accepted" if paired.accepted else "rejected",
            reason=paired.reason,
            version=cand.version,
            evaluation=paired,
        )
        if paired.accepted and handoff:
            cfg = PromptLayerConfig(**staging.settings())
            exp_id = hand_off(reg, name, paired, cfg, "evoharness prompt-evolve")
            p = p.model_copy(update={"experiment_id": exp_id})
        record_proposal(reg, name, p, counted=False, actor="evoharness prompt-evolve")
        _proposal(p)
    finally:
        reg.close()
