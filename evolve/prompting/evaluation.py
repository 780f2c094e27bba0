"""Paired offline evaluation of a prompt candidate against the active version.

Both versions run every task of the frozen validation split and of a guard split, with the
same environment seed (the same simulated faults, the same offline-model draws) — only the
system prompt differs. An exact McNemar test on the paired successes decides; any P0
regression (a task where the active version had no P0 failure and the candidate has one)
on the guard split — or on the validation split — rejects.

Runs go through an executor (:class:`~evoharness.sdk.executors.LocalExecutor` or
``RayExecutor``); each finished ``(split, task, version)`` run is committed to a SQLite
file the moment it exists, so a killed evaluation resumes where it stopped and never runs a
task twice. Every run is traced (``prompt_name``/``prompt_version`` set, tagged
``prompt-eval``, ``eval:<id>``, ``candidate:<ref>`` and its arm) as an **offline run**: tagged
:data:`~evoharness.harness.tracing.provenance.OFFLINE_TAG`, which every production read
leaves out; the CLI writes them to a store of their own (``<db>.eval.db``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evoharness.evolve.prompting.paired import SplitComparison, compare, mcnemar_exact
from evoharness.harness.errors import ConfigError
from evoharness.sdk.sqlite import open_sqlite

__all__ = [
    "EvalItem",
    "EvalResults",
    "MemoryPin",
    "PairedEvaluation",
    "PairedReport",
    "Prompted",
    "RunRecord",
    "SplitComparison",
    "close_worker_caches",
    "mcnemar_exact",
    "pin_memory",
    "run_item",
]

Arm = Literal["control", "candidate"]


class MemoryPin(BaseModel):
    """The memory snapshot both arms are served through the session door: ``memory/<name>``
    version ``version`` of the registry at ``registry`` (a path or a PostgreSQL URL)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    registry: str
    name: str
    version: int


def pin_memory(registry: Any, name: str, *, label: str = "active") -> MemoryPin | None:
    """The snapshot ``label`` of ``memory/<name>`` points at now, pinned for an evaluation
    (``None``: nothing published yet). ``registry`` is a path or URL, or a
    :class:`~evoharness.sdk.registry.Registry` opened from a file or PostgreSQL (worker
    processes open it again from there).

    Raises:
        ConfigError: An in-memory registry (workers could not open it).
    """
    from evoharness.sdk.memory import MEMORY
    from evoharness.sdk.registry import open_registry

    if isinstance(registry, str | Path):
        with open_registry(registry) as opened:
            return pin_memory(opened, name, label=label)
    where = getattr(registry, "url", None) or getattr(registry, "path", None)
    if not isinstance(where, str | Path) or str(where) == ":memory:":
        raise ConfigError(
            "pin_memory needs a registry in a file or PostgreSQL (evaluation workers open it)",
            field="registry",
        )
    version = registry.labels(MEMORY, name).get(label)
    return MemoryPin(registry=str(where), name=name, version=version) if version else None


class EvalItem(BaseModel):
    """One run to do: a task of a split with one prompt version (picklable, for any executor).

    Attributes:
        env: Environment plugin spec (a registered name or ``package.module:Object``).
        env_options: Options for the environment's run side (seed, faults, ...).
        split: The split the task comes from.
        task_id: The task.
        prompt_name: The prompt's name.
        version: The prompt version run (recorded on the trace).
        prompt_text: The rendered system prompt of that version.
        arm: ``control`` (the active version) or ``candidate``.
        eval_id: The evaluation this run belongs to.
        candidate_ref: The candidate version's ref (``prompt/<name>@v<n>``): every run is
            tagged with it.
        trace_db: Trace store the run is recorded into (``None``: untraced); an offline
            run either way (tagged ``evoharness.offline``).
        memory: The memory snapshot served through the session door (the same for both
            arms; recorded on each run's trace as ``memory/<name>``).
        harness: Run with the environment's harness middleware.
        max_model_calls: Step limit per run.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str
    env_options: dict[str, Any] = Field(default_factory=dict)
    split: str
    task_id: str
    prompt_name: str
    version: int
    prompt_text: str
    arm: Arm
    eval_id: str
    candidate_ref: str
    trace_db: str | None = None
    memory: MemoryPin | None = None
    harness: bool = True
    max_model_calls: int = 40


class RunRecord(BaseModel):
    """The result of one :class:`EvalItem`."""

    split: str
    task_id: str
    version: int
    arm: Arm
    success: bool
    score: float
    p0: bool
    failures: list[str] = Field(default_factory=list)
    error: str | None = None
    trace_id: str | None = None
    tokens: int = 0


# -- the worker side (module level: picklable for process and Ray executors) ---------------
_CACHE_LOCK = threading.Lock()
_ENVS: dict[str, Any] = {}
_STORES: dict[str, Any] = {}
_REGISTRIES: dict[str, Any] = {}
_SOURCES: dict[str, Any] = {}


def _runtime(item: EvalItem) -> tuple[Any, frozenset[str]]:
    """The run-side environment and its P0 item ids (cached per process)."""
    from evoharness.evolve.environment import load_plugin, runtime_of
    from evoharness.evolve.judging.rubric import BASE_ITEMS

    key = json.dumps([item.env, item.env_options], sort_keys=True, default=str)
    with _CACHE_LOCK:
        hit = _ENVS.get(key)
        if hit is None:
            plugin = load_plugin(item.env)
            env = runtime_of(plugin, **item.env_options)
            p0 = {i.id for i in BASE_ITEMS if i.priority == "P0"}
            p0 |= {i.id for i in plugin.rubric_items("") if i.priority == "P0"}
            p0 |= {
                i.id
                for t in env.tasks(item.split)[:1]
                for i in plugin.rubric_items(t.request)
                if i.priority == "P0"
            }
            hit = _ENVS[key] = (env, frozenset(p0))
        return hit


def _memory_source(pin: MemoryPin, env: str) -> Any:
    """The session source serving ``pin`` with the case key of the plugin ``env`` (the
    one its memory was learned with); built once per process and pin (the registry opened,
    the plugin loaded and the snapshot indexed once, not per evaluated run)."""
    from evoharness.evolve.environment import load_plugin
    from evoharness.evolve.promotion import fixed_source
    from evoharness.sdk.memory import MEMORY
    from evoharness.sdk.registry import open_registry

    key = json.dumps([pin.registry, pin.name, pin.version, env])
    with _CACHE_LOCK:
        source = _SOURCES.get(key)
        if source is not None:
            return source
        registry = _REGISTRIES.get(pin.registry)
        if registry is None:
            registry = _REGISTRIES[pin.registry] = open_registry(pin.registry)
        plugin = load_plugin(env)

        def case_key(query: str) -> str:
            return plugin.case_key(query, {})

        source = _SOURCES[key] = fixed_source(
            registry, MEMORY, pin.name, pin.version, case_key=case_key
        )
        return source


def worker_trace_store(path: str) -> Any:
    """The trace store at ``path`` that this process's evaluation runs write to (opened once
    per process, closed by :func:`close_worker_caches`); read it back through the same
    object, so what the runs recorded is flushed before it is read."""
    from evoharness.harness.tracing import TraceStore

    with _CACHE_LOCK:
        if path not in _STORES:
            _STORES[path] = TraceStore(path)
        return _STORES[path]


def close_worker_caches() -> None:
    """Close the trace stores and drop the environments this process cached."""
    with _CACHE_LOCK:
        for s in [*_STORES.values(), *_REGISTRIES.values()]:
            s.close()
        _STORES.clear()
        _REGISTRIES.clear()
        _SOURCES.clear()
        _ENVS.clear()


class Prompted:
    """An environment whose system prompt is one prompt version's text (everything else
    delegated to ``env``)."""

    def __init__(self, env: Any, prompt: str) -> None:
        self._env = env
        self._prompt = prompt
        self.name = env.name

    def system_prompt(self) -> str:
        return self._prompt

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def run_item(item: EvalItem) -> RunRecord:
    """Run one task with one prompt version and score it (never raises for a failed run)."""
    from evoharness.harness.tracing import RunInfo, Tracer
    from evoharness.harness.tracing.provenance import OFFLINE_TAG
    from evoharness.sdk.runner import run_task

    env, p0_ids = _runtime(item)
    task = next((t for t in env.tasks(item.split) if t.task_id == item.task_id), None)
    if task is None:
        raise ConfigError(
            f"task {item.task_id!r} is not in split {item.split!r} of {item.env!r}", field="task"
        )
    store = worker_trace_store(item.trace_db) if item.trace_db else None
    tracer = Tracer(store) if store is not None else None
    info = RunInfo(
        run_id=f"prompt-eval:{item.eval_id}:{item.split}:{item.task_id}:v{item.version}:"
        f"{uuid.uuid4().hex[:8]}",
        tags=[
            env.name,
            OFFLINE_TAG,
            "prompt-eval",
            item.split,
            item.arm,
            f"eval:{item.eval_id}",
            f"candidate:{item.candidate_ref}",
        ],
        prompt_name=item.prompt_name,
        # version 0 is a search candidate, not a published version: none is recorded
        prompt_version=str(item.version) if item.version else None,
        artifacts={f"prompt/{item.prompt_name}": str(item.version)} if item.version else {},
        metadata={
            "task_id": item.task_id,
            "split": item.split,
            "eval_id": item.eval_id,
            "arm": item.arm,
            "candidate": item.candidate_ref,
        },
    )
    result = asyncio.run(
        run_task(
            Prompted(env, item.prompt_text),
            task,
            model=env.offline_model(),
            middleware=env.harness_middleware() if item.harness else (),
            max_model_calls=item.max_model_calls,
            tracer=tracer,
            run_info=info,
            artifacts=[_memory_source(item.memory, item.env)] if item.memory is not None else (),
        )
    )
    if store is not None:
        store.flush(60)
    return RunRecord(
        **item.model_dump(include={"split", "task_id", "version", "arm"}),
        **result.model_dump(include={"success", "score", "failures", "error", "trace_id"}),
        p0=bool(set(result.failures) & p0_ids) or result.error is not None,
        tokens=result.input_tokens + result.output_tokens,
    )


# -- the resumable result store --------------------------------------------------------------
class EvalResults:
    """Finished runs by ``(eval_id, split, task_id, version)``, committed one by one.

    Args:
        path: SQLite file (created with its parents).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn = open_sqlite(self.path)
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS runs (eval_id TEXT, split TEXT, task_id TEXT, "
            "version INTEGER, record TEXT, PRIMARY KEY (eval_id, split, task_id, version))"
        )

    def done(self, eval_id: str) -> dict[tuple[str, str, int], RunRecord]:
        """The finished runs of ``eval_id``."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT split, task_id, version, record FROM runs WHERE eval_id=?", (eval_id,)
            ).fetchall()
        return {(s, t, v): RunRecord.model_validate_json(r) for s, t, v, r in rows}

    def put(self, eval_id: str, record: RunRecord) -> None:
        """Commit one finished run (idempotent)."""
        with self._lock:
            self._conn.execute(
                "INSERT OR IGNORE INTO runs VALUES (?,?,?,?,?)",
                (eval_id, record.split, record.task_id, record.version, record.model_dump_json()),
            )

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()


class PairedReport(BaseModel):
    """The outcome of a paired evaluation."""

    eval_id: str
    prompt: str
    control: int
    candidate: int
    accepted: bool
    reason: str
    val: SplitComparison
    guard: SplitComparison | None = None
    alpha: float
    ran: int
    """Runs executed by this call."""
    reused: int
    """Runs found finished in the result store (a resumed evaluation)."""
    trace_ids: list[str] = Field(default_factory=list)

    @property
    def rollouts(self) -> int:
        """All runs of the evaluation (executed now or before)."""
        return self.ran + self.reused


class PairedEvaluation:
    """Run and decide a paired evaluation (resumable).

    Args:
        env: Environment plugin spec (registered name or ``package.module:Object``).
        results: Where finished runs are committed (:class:`EvalResults`).
        executor: Any :class:`~evoharness.sdk.executors.Executor` (default: 4 threads).
        env_options: Options of the run side; both arms get the same ones (same seed,
            same faults).
        trace_db: Trace store for the runs.
        memory: The memory snapshot both arms are served (:func:`pin_memory`).
        alpha: Significance level of the one-sided exact McNemar test.
        reject_val_p0: Also reject on a P0 regression on the validation split.
    """

    def __init__(
        self,
        env: str,
        results: EvalResults,
        *,
        executor: Any = None,
        env_options: dict[str, Any] | None = None,
        trace_db: Path | str | None = None,
        memory: MemoryPin | None = None,
        alpha: float = 0.05,
        reject_val_p0: bool = True,
        harness: bool = True,
    ) -> None:
        if not 0 < alpha < 1:
            raise ConfigError(f"alpha must be in (0, 1), got {alpha}", field="alpha")
        self.env = env
        self.results = results
        self.executor: Any = executor
        self._own: Any = None
        self.env_options = dict(env_options or {})
        self.trace_db = str(trace_db) if trace_db is not None else None
        self.memory = memory
        self.alpha = alpha
        self.reject_val_p0 = reject_val_p0
        self.harness = harness

    def _executor(self) -> Any:
        if self.executor is not None:
            return self.executor
        from evoharness.sdk.executors import LocalExecutor

        own = LocalExecutor("threads", workers=4)
        self.executor = self._own = own
        return own

    def close(self) -> None:
        """Stop the executor this evaluation created (a given one is left to its owner)."""
        own = getattr(self, "_own", None)
        if own is not None:
            own.close()
            self._own = None
            self.executor = None

    def eval_id(
        self,
        prompt: str,
        control: tuple[int, str],
        candidate: tuple[int, str],
        splits: Sequence[tuple[str, Sequence[str]]],
    ) -> str:
        """A content id: the same inputs resume the same evaluation."""
        blob = json.dumps(
            [
                self.env,
                self.env_options,
                self.memory.model_dump() if self.memory is not None else None,
                self.harness,
                prompt,
                control,
                candidate,
                splits,
            ],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def items(
        self,
        eval_id: str,
        prompt: str,
        control: tuple[int, str],
        candidate: tuple[int, str],
        splits: Sequence[tuple[str, Sequence[str]]],
    ) -> list[EvalItem]:
        """Every run of the evaluation, control and candidate interleaved per task."""
        shared: dict[str, Any] = {  # the same for every run of the evaluation
            "env": self.env,
            "env_options": self.env_options,
            "prompt_name": prompt,
            "eval_id": eval_id,
            "candidate_ref": f"prompt/{prompt}@v{candidate[0]}",
            "trace_db": self.trace_db,
            "memory": self.memory,
            "harness": self.harness,
        }
        out: list[EvalItem] = []
        for split, task_ids in splits:
            for task_id in task_ids:
                for arm, (version, text) in (("control", control), ("candidate", candidate)):
                    if arm == "candidate" and version == control[0]:
                        continue  # the same version twice (a plain measurement): one run
                    out.append(
                        EvalItem(
                            **shared,
                            split=split,
                            task_id=task_id,
                            version=version,
                            prompt_text=text,
                            arm=arm,
                        )
                    )
        return out

    def run(
        self,
        prompt: str,
        control: tuple[int, str],
        candidate: tuple[int, str],
        *,
        val: tuple[str, Sequence[str]],
        guard: tuple[str, Sequence[str]] | None = None,
        on_result: Callable[[RunRecord], None] | None = None,
    ) -> PairedReport:
        """Evaluate ``candidate`` against ``control`` (each ``(version, rendered text)``).

        Args:
            prompt: The prompt name.
            control: The active version and its text.
            candidate: The candidate version and its text.
            val: ``(split, task ids)`` of the frozen validation split.
            guard: ``(split, task ids)`` of the guard split.
            on_result: Called with each run as it is committed.
        """
        splits = [val, *([guard] if guard is not None else [])]
        frozen = [(s, list(ids)) for s, ids in splits]
        eval_id = self.eval_id(prompt, control, candidate, frozen)
        done = self.results.done(eval_id)
        items = self.items(eval_id, prompt, control, candidate, frozen)
        todo = [i for i in items if (i.split, i.task_id, i.version) not in done]

        def finished(index: int, record: RunRecord) -> None:
            self.results.put(eval_id, record)
            if on_result is not None:
                on_result(record)

        if todo:
            self._executor().map(run_item, todo, on_done=finished)
        records = self.results.done(eval_id)

        def pairs(split: str, ids: Sequence[str]) -> list[tuple[RunRecord, RunRecord]]:
            return [
                (records[(split, t, control[0])], records[(split, t, candidate[0])]) for t in ids
            ]

        v = compare(val[0], pairs(*val))
        g = compare(guard[0], pairs(*guard)) if guard is not None else None
        accepted, reason = self.decide(v, g)
        return PairedReport(
            eval_id=eval_id,
            prompt=prompt,
            control=control[0],
            candidate=candidate[0],
            accepted=accepted,
            reason=reason,
            val=v,
            guard=g,
            alpha=self.alpha,
            ran=len(todo),
            reused=len(items) - len(todo),
            trace_ids=sorted(r.trace_id for r in records.values() if r.trace_id),
        )

    def decide(self, val: SplitComparison, guard: SplitComparison | None) -> tuple[bool, str]:
        """Accept on a significant paired win on val with no P0 regression; say why."""
        if guard is not None and guard.p0_regressions:
            return False, (
                f"P0 regression on the guard split ({guard.split}): "
                f"{len(guard.p0_regressions)} task(s) {guard.p0_regressions[:5]}"
            )
        if self.reject_val_p0 and val.p0_regressions:
            return False, (
                f"P0 regression on the validation split: {len(val.p0_regressions)} task(s) "
                f"{val.p0_regressions[:5]}"
            )
        summary = (
            f"val success {val.control_success:.3f} -> {val.candidate_success:.3f} "
            f"(+{val.wins}/-{val.losses} paired, exact McNemar p={val.p_value:.4f})"
        )
        if val.wins > val.losses and val.p_value < self.alpha:
            return True, f"significant paired win: {summary}"
        return False, f"no significant paired win (alpha {self.alpha}): {summary}"
