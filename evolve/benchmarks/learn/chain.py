"""One run of the chain: the work dir, the served model, and each layer's paired evaluation."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel

from evoharness.evolve.benchmarks.bfcl import (
    TOOL_CALL_TOKENS,
    BatchingPool,
    Layer,
    TokenLoRA,
    paired_p,
)
from evoharness.evolve.benchmarks.learn.settings import MODELS, TINY, Echo, EnvSpec, Settings
from evoharness.evolve.benchmarks.learn.table import new_p0
from evoharness.evolve.environment import load_plugin, runtime_of
from evoharness.evolve.prompting.evaluation import Prompted
from evoharness.evolve.weights import (
    LoRASpec,
    TrainProgress,
    TrainResult,
    publish_adapter,
    tool_schemas,
)
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.environment import TaskSpec
from evoharness.sdk.registry import Registry, open_registry
from evoharness.sdk.runner import TaskResult, run_tasks
from evoharness.sdk.serving.base_models import resolve_base
from evoharness.sdk.serving.local import BASE, AdapterPool, LocalChatModel
from evoharness.sdk.session import ArtifactSource, MemorySource


def write_json(path: Path, body: Any) -> None:
    """Write ``body`` to ``path`` atomically (a killed run leaves no half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


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
        self.adapters: dict[str, tuple[str, int]] = {}  # layer -> adapter (dir, version)
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
        """Close the registry and flush the trace store."""
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
        """The served model (``adapter``: a served name, or the base) at ``temperature``."""
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

    def publish(self, result: TrainResult, manifest: dict[str, Any], parent: int | None) -> int:
        """Publish a trained adapter as the next version of the chain's policy (the same
        files published before: that version)."""
        return publish_adapter(
            self.registry,
            self.policy,
            result.adapter_dir,
            base_model=self.base,
            dataset_manifest=manifest,
            metrics=result.metrics,
            fingerprint=result.fingerprint,
            parent=parent,
        ).version

    def run_options(self) -> dict[str, Any]:
        """What every training run of the chain shares: the base model, the row length, bf16
        on a real model, and the LoRA (:meth:`lora`)."""
        return {
            "base_model": self.base,
            "max_length": self.settings.max_length,
            "bf16": not self.simulated,
            "lora": self.lora(),
        }

    def lora(self) -> LoRASpec:
        """LoRA, plus the ``<tool_call>`` rows when they are single tokens of the model."""
        vocab = self.pool.pool.tokenizer.get_vocab()
        if all(t in vocab for t in TOOL_CALL_TOKENS):
            return TokenLoRA(token_indices=tuple(vocab[t] for t in TOOL_CALL_TOKENS))
        return LoRASpec()

    def progress(self, label: str) -> TrainProgress:
        """A training progress callback that prints every tenth step and the last."""

        def show(step: int, total: int, logs: dict[str, float]) -> None:
            if step % 10 == 0 or step == total:
                self.echo(f"    {label} step {step}/{total} loss={logs.get('loss', 0):.3f}")

        return show

    # -- running tasks ---------------------------------------------------------------------
    def last_kept(self) -> Layer:
        """The last layer kept: the configuration every later layer builds on."""
        return next(x for x in reversed(self.layers) if x.kept)

    def memory_source(self) -> MemorySource:
        """The chain's memory through the session door, with the environment's case key
        (the one the evolve cycle learned with: a session gets its own pattern's lessons)."""
        return MemorySource(self.registry, self.memory_name, case_key=self.plugin.case_key)

    def kept(self) -> tuple[Any, list[ArtifactSource]]:
        """The environment and artifacts of the kept layers so far."""
        kept = {x.name for x in self.layers if x.kept}
        arts: list[ArtifactSource] = []
        if "memory" in kept:
            arts.append(self.memory_source())
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
        """Run ``tasks`` through ``create_evo_agent``, traced into the work dir's store."""
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
            write_json(path, body)
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
