"""``evoharness bench scale``: costs that must not grow with history they do not need.

Real shop traces are recorded once (the shop's offline, SIMULATED policy run through the
harness with :mod:`evoharness.sdk.runner`), then replicated in bulk with new ids and
timestamps into stores of growing size. For each size the bench times:

- **episode reads**: the newest 1,000 episodes, and the newest 100 with a rare tag;
- **a cycle** (judge -> route -> curate) over a fixed batch of new episodes while the
  judged history grows;
- **export drain**: the outbox calls an exporter makes (``pending`` -> ``mark_exported``)
  for a growing backlog, without the network;
- **context**: the context middleware's work per model call at growing session length;
- **memory retrieval**: top-k for a request at growing memory size.

Every ``*_exp`` is the fitted log-log slope (``numpy.polyfit``) of the cost against the size
that should not matter (0 = flat, 1 = linear). Last line::

    read_exp=… cycle_history_exp=… context_round_exp=… memory_exp=… read_100k_window_s=…

Bulk replication (documented in ``docs/operations.md``, "Scale"): writing 100k traces
through ``TraceStore.put`` costs a validation, masking and upsert per record (~19 records
per shop trace), minutes on two cores. The recorded rows are instead copied with SQL inside
one transaction per table (``INSERT ... SELECT`` over the recorded rows x a replica
counter), rewriting ids, trace ids, parent ids, delta-input bases and timestamps in the row
and in its JSON body, and stamping change sequence numbers after the store's maximum, the
same invariants the writer keeps. The evolve state's verdicts and routes are replicated the
same way from one real cycle.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from langchain.agents.middleware import ModelRequest, ModelResponse
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from evoharness.evolve._harnessed import run_harnessed
from evoharness.evolve.cycle import CycleReport, run_plugin_cycle
from evoharness.evolve.environment import (
    EvolveEnvironment,
    load_plugin,
)
from evoharness.evolve.episodes.traces import Episode, EpisodeFilter, LocalTraceSource
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.memory.reducer import MemoryOp, reduce_ops
from evoharness.harness.context import ContextConfig, ContextMiddleware
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.harness.tracing.store import RecordKind
from evoharness.sdk.environment import load_environment
from evoharness.sdk.memory import MemoryEntry, MemoryRetriever, MemoryStore

Echo = Callable[[str], None]
RARE_TAG = "scale-tagged"
"""Carried by one replicated trace in ten: "the newest 100 with a tag" reads 100, not all."""
_GAP_S = 30.0  # seconds between replicas of the same recorded trace
_CONTEXT_SAMPLES = 15  # calls per context measurement point
_BATCH_SALT = 0x4000_0000  # replica numbers of cycle batches (history replicas count from 0)


@dataclass
class Plan:
    """Sizes of one bench run (``quick``: a smoke test in seconds)."""

    tasks: int = 40
    store_sizes: tuple[int, ...] = (1_000, 10_000, 100_000)
    window: int = 1_000
    tag_limit: int = 100
    batch: int = 240
    backlogs: tuple[int, ...] = (1_000, 2_000, 4_000)
    rounds: tuple[int, ...] = (50, 200, 800)
    memory_sizes: tuple[int, ...] = (1_000, 10_000, 100_000)
    reps: int = 3

    @classmethod
    def quick(cls) -> Plan:
        """Small sizes: every stage runs, the numbers are only indicative."""
        return cls(
            tasks=8,
            store_sizes=(200, 1_000),
            window=100,
            tag_limit=5,
            batch=16,
            backlogs=(100, 400),
            rounds=(20, 80),
            memory_sizes=(200, 2_000),
            reps=1,
        )


@dataclass
class Results:
    """Per-size timings (seconds) of each stage."""

    window: dict[int, float] = field(default_factory=dict)
    tag: dict[int, float] = field(default_factory=dict)
    cycle: dict[int, float] = field(default_factory=dict)
    drain: dict[int, float] = field(default_factory=dict)
    context: dict[int, float] = field(default_factory=dict)
    memory: dict[int, float] = field(default_factory=dict)
    memory_cold: dict[int, float] = field(default_factory=dict)
    curation: dict[int, dict[str, float]] = field(default_factory=dict)


def fit_exponent(sizes: Sequence[float], costs: Sequence[float]) -> float:
    """The log-log slope of ``costs`` against ``sizes`` (``numpy.polyfit``, degree 1)."""
    x = np.log(np.asarray(sizes, dtype=float))
    y = np.log(np.maximum(np.asarray(costs, dtype=float), 1e-9))
    return float(np.polyfit(x, y, 1)[0])


def _median_time(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# -- recording and bulk replication ---------------------------------------------------------
def record(path: Path, tasks: int, echo: Echo = print) -> int:
    """Run ``tasks`` shop train tasks (SIMULATED offline policy) through the harness, traced
    into a store at ``path``; returns the number of traces."""
    store = TraceStore(path)
    env = load_environment("shop", faults="none", seed=0)
    chosen = list(env.tasks("train"))[:tasks]
    results = run_harnessed(env, chosen, tracer=Tracer(store), tags=["scale-bench"])
    store.flush(60)
    store.close()
    echo(f"recorded {len(results)} shop sessions ({sum(r.success for r in results)} solved)")
    return len(results)


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    # replica ids land all over the id indexes: a page cache that holds them turns random
    # page reads and rewrites into memory work (the copy's main cost without it)
    conn.execute("PRAGMA cache_size=-524288")  # 512 MiB, this connection only
    return conn


@contextmanager
def _replica_batch(path: Path, base: Path, first: int, count: int) -> Iterator[sqlite3.Connection]:
    """One transaction on ``path`` with ``base`` attached as ``base`` and the replica numbers
    ``first`` .. ``first + count - 1`` in ``temp.k(n)``: committed when the block ends,
    rolled back when it raises."""
    conn = _connect(path)
    try:
        conn.execute("ATTACH DATABASE ? AS base", (str(base),))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DROP TABLE IF EXISTS temp.k")
        conn.execute("CREATE TEMP TABLE k (n INTEGER PRIMARY KEY)")
        conn.executemany(
            "INSERT INTO temp.k VALUES (?)", [(n,) for n in range(first, first + count)]
        )
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()


def _hex_id(column: str, keep: int, salt: int) -> str:
    """SQL for a replica's id: the recorded id's first ``keep`` hex digits, then the replica
    number (plus ``salt``) as 8 hex digits: still a W3C id, unique per replica."""
    return f"(substr({column}, 1, {keep}) || printf('%08x', {salt} + k.n))"


def replicate(store: Path, base: Path, first: int, count: int, *, salt: int = 0) -> None:
    """Copy every recorded trace of ``base`` into ``store`` as replicas ``first`` ..
    ``first + count - 1``: new ids (see :func:`_hex_id`), start times shifted by
    ``k * 30 s`` past the newest recorded one, change sequence numbers after the store's
    maximum; one trace in ten also carries :data:`RARE_TAG`. One transaction.

    Both files must be trace stores (``TraceStore(path)`` creates the tables).
    """
    with _replica_batch(store, base, first, count) as conn:
        conn.execute("DROP TABLE IF EXISTS temp.t")
        conn.execute(
            "CREATE TEMP TABLE t AS SELECT id, ROW_NUMBER() OVER (ORDER BY start_time, id) AS i "
            "FROM base.traces"
        )
        n_base = int(conn.execute("SELECT COUNT(*) FROM temp.t").fetchone()[0])
        span = conn.execute("SELECT MIN(start_time), MAX(start_time) FROM base.traces").fetchone()
        t0, t1 = float(span[0]), float(span[1])
        shift = f"(? + k.n * {_GAP_S})"  # ? = t1 - t0 + 1: replicas come after the recording
        # free-form ids (sessions, runs, scores); NULL stays NULL
        new = f"(%s || '.' || ({salt} + k.n))"
        tid = {c: _hex_id(c, 24, salt) for c in ("b.id", "g.owner", "a.owner", "o.trace_id")}
        tid["s.trace_id"] = _hex_id("s.trace_id", 24, salt)
        oid = {c: _hex_id(c, 8, salt) for c in ("o.id", "o.parent_id")}
        seq0 = int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM main.traces").fetchone()[0])
        cols = [r[1] for r in conn.execute("PRAGMA main.table_info(traces)")]
        values = {
            "id": tid["b.id"],
            "start_time": f"b.start_time + {shift}",
            "end_time": f"b.end_time + {shift}",
            "updated_at": f"b.updated_at + {shift}",
            "exported_at": "NULL",
            "session_id": new % "b.session_id",
            "run_id": new % "b.run_id",
            "seq": f"{seq0} + (k.n - {first}) * {n_base} + t.i",
            "body": (
                "json_set(CASE WHEN (k.n + t.i) % 10 = 0 THEN json_insert(b.body, '$.tags[#]', "
                f"'{RARE_TAG}') ELSE b.body END, '$.id', {tid['b.id']}, '$.start_time', "
                f"b.start_time + {shift}, '$.end_time', b.end_time + {shift}, '$.session_id', "
                f"{new % 'b.session_id'}, '$.run_id', {new % 'b.run_id'})"
            ),
        }
        shift_args = t1 - t0 + 1
        select = ", ".join(values.get(c, f"b.{c}") for c in cols)
        n_shift = select.count("?")
        conn.execute(
            f"INSERT INTO main.traces ({', '.join(cols)}) SELECT {select} "
            "FROM base.traces b JOIN temp.t t ON t.id = b.id CROSS JOIN temp.k k",
            [shift_args] * n_shift,
        )
        conn.execute(
            f"INSERT INTO main.traces_tags SELECT {tid['g.owner']}, g.value "
            "FROM base.traces_tags g CROSS JOIN temp.k k"
        )
        conn.execute(
            f"INSERT INTO main.traces_tags SELECT {tid['b.id']}, '{RARE_TAG}' "
            "FROM base.traces b JOIN temp.t t ON t.id = b.id CROSS JOIN temp.k k "
            "WHERE (k.n + t.i) % 10 = 0"
        )
        conn.execute(
            f"INSERT INTO main.traces_artifacts SELECT {tid['a.owner']}, a.key, a.value "
            "FROM base.traces_artifacts a CROSS JOIN temp.k k"
        )
        ref = "'$.input.\"$messages\"'"
        base_ref = "json_extract(o.body, '$.input.\"$messages\".base')"
        obs_body = (
            f"json_set(o.body, '$.id', {oid['o.id']}, '$.trace_id', {tid['o.trace_id']}, "
            f"'$.parent_id', {oid['o.parent_id']}, '$.start_time', o.start_time + {shift})"
        )
        obs_body = (
            f"CASE WHEN json_type(o.body, {ref}) = 'object' THEN json_set({obs_body}, "
            f"'$.input.\"$messages\".base', "
            f"{_hex_id(base_ref, 8, salt)}) ELSE {obs_body} END"
        )
        obs_cols = [r[1] for r in conn.execute("PRAGMA main.table_info(observations)")]
        obs_values = {
            "id": oid["o.id"],
            "trace_id": tid["o.trace_id"],
            "parent_id": oid["o.parent_id"],
            "start_time": f"o.start_time + {shift}",
            "updated_at": f"o.updated_at + {shift}",
            "exported_at": "NULL",
            "body": obs_body,
        }
        select = ", ".join(obs_values.get(c, f"o.{c}") for c in obs_cols)
        conn.execute(
            f"INSERT INTO main.observations ({', '.join(obs_cols)}) SELECT {select} "
            "FROM base.observations o CROSS JOIN temp.k k",
            [shift_args] * select.count("?"),
        )
        score_cols = [r[1] for r in conn.execute("PRAGMA main.table_info(scores)")]
        score_values = {
            "id": new % "s.id",
            "trace_id": tid["s.trace_id"],
            "updated_at": f"s.updated_at + {shift}",
            "exported_at": "NULL",
            "body": f"json_set(s.body, '$.id', {new % 's.id'}, '$.trace_id', {tid['s.trace_id']})",
        }
        select = ", ".join(score_values.get(c, f"s.{c}") for c in score_cols)
        conn.execute(
            f"INSERT INTO main.scores ({', '.join(score_cols)}) SELECT {select} "
            "FROM base.scores s CROSS JOIN temp.k k",
            [shift_args] * select.count("?"),
        )
        conn.execute("INSERT OR IGNORE INTO main.messages SELECT * FROM base.messages")


def replicate_state(state: Path, base: Path, first: int, count: int, *, salt: int = 0) -> None:
    """Copy the verdicts and routes of ``base`` (an evolve state after one cycle over the
    recorded traces) for replicas ``first`` .. ``first + count - 1`` (the ids
    :func:`replicate` gives). One transaction."""
    with _replica_batch(state, base, first, count) as conn:
        new = _hex_id("j.trace_id", 24, salt)
        cols = [r[1] for r in conn.execute("PRAGMA main.table_info(judgments)")]
        values = {
            "trace_id": new,
            "verdict": f"json_replace(j.verdict, '$.trace_id', {new})",
        }
        select = ", ".join(values.get(c, f"j.{c}") for c in cols)
        conn.execute(
            f"INSERT OR REPLACE INTO main.judgments ({', '.join(cols)}) SELECT {select} "
            "FROM base.judgments j CROSS JOIN temp.k k"
        )
        cols = [r[1] for r in conn.execute("PRAGMA main.table_info(routes)")]
        values = {
            "trace_id": new,
            "package": f"json_replace(j.package, '$.trace_id', {new}, '$.verdict.trace_id', {new})",
            "created_at": f"j.created_at + k.n * {_GAP_S}",
        }
        select = ", ".join(values.get(c, f"j.{c}") for c in cols)
        conn.execute(
            f"INSERT OR REPLACE INTO main.routes ({', '.join(cols)}) SELECT {select} "
            "FROM base.routes j CROSS JOIN temp.k k"
        )


# -- stages -------------------------------------------------------------------------------
def time_reads(store: TraceStore, plan: Plan) -> tuple[float, float]:
    """(newest ``window`` episodes, newest ``tag_limit`` with the rare tag), seconds."""
    source = LocalTraceSource(store)
    window = EpisodeFilter(newest_first=True, limit=plan.window)
    tagged = EpisodeFilter(tags=[RARE_TAG], newest_first=True, limit=plan.tag_limit)
    got: list[int] = []

    def read(where: EpisodeFilter) -> None:
        got.append(sum(1 for _ in source.episodes(where)))

    w = _median_time(lambda: read(window), plan.reps)
    t = _median_time(lambda: read(tagged), plan.reps)
    if got[0] != plan.window or got[-1] != plan.tag_limit:
        raise RuntimeError(f"scale bench: read {got[0]} / {got[-1]} episodes, store too small")
    return w, t


def _cycle(
    plugin: EvolveEnvironment,
    store: TraceStore,
    state: EvolveState,
    memory: MemoryStore,
    *,
    where: EpisodeFilter | None = None,
) -> CycleReport:
    """One evolve cycle over ``store``'s episodes with ``plugin``'s judge, rubrics and
    proposer."""
    return asyncio.run(
        run_plugin_cycle(
            plugin, store, state=state, memory=memory, where=where, scores_to=None, owns=plugin.owns
        )
    )


def time_cycle(
    store_path: Path, base: Path, state_path: Path, work: Path, history: int, plan: Plan
) -> float:
    """One cycle over ``plan.batch`` new episodes with ``history`` judged traces before."""
    plugin = load_plugin("shop")
    n_base = _count(base)
    store = TraceStore(store_path)
    cursor = store.cursor()
    replicate(store_path, base, 0, -(-plan.batch // n_base), salt=_BATCH_SALT + history)
    state = EvolveState(state_path)
    memory = MemoryStore(work / f"memory-{history}.db")
    t0 = time.perf_counter()
    where = EpisodeFilter(after_cursor=str(cursor), limit=plan.batch)
    report = _cycle(plugin, store, state, memory, where=where)
    seconds = time.perf_counter() - t0
    state.close()
    memory.close()
    store.close()
    if report.episodes != plan.batch:
        raise RuntimeError(f"scale bench: the cycle saw {report.episodes} episodes")
    return seconds


def _count(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM traces").fetchone()[0])
    finally:
        conn.close()


def time_drain(base: Path, work: Path, backlog: int) -> tuple[float, int]:
    """Drain a backlog of ``backlog`` traces (with their observations and scores) the way
    an exporter does, minus the network: (seconds, records)."""
    path = work / f"drain-{backlog}.db"
    TraceStore(path).close()
    n_base = _count(base)
    replicate(path, base, 0, -(-backlog // n_base))
    store = TraceStore(path)
    records = 0
    t0 = time.perf_counter()
    kinds: tuple[RecordKind, ...] = ("trace", "observation", "score")
    for kind in kinds:
        while rows := store.pending(kind, limit=500):
            records += store.mark_exported(kind, [(b["id"], u) for b, u in rows])
    seconds = time.perf_counter() - t0
    store.close()
    return seconds, records


def _to_message(record: dict[str, Any], n: int) -> AIMessage | ToolMessage | None:
    role, content = record.get("role"), record.get("content") or ""
    if role == "ai":
        calls = [
            {"name": c["name"], "args": c.get("args") or {}, "id": f"{c.get('id')}-{n}"}
            for c in record.get("tool_calls") or []
        ]
        return AIMessage(content=content, tool_calls=calls, id=f"a{n}")
    if role == "tool":
        return ToolMessage(
            content,
            tool_call_id=f"{record.get('tool_call_id')}-{n}",
            name=record.get("name"),
            id=f"t{n}",
        )
    return None


def time_context(episodes: Sequence[Episode], work: Path, plan: Plan) -> dict[int, float]:
    """Per model call work of the context middleware at each of ``plan.rounds``: a session
    that repeats the recorded tool rounds of real shop sessions. Each point is the median
    of the :data:`_CONTEXT_SAMPLES` calls up to it, which add the same recorded rounds at
    every point (the work per call follows the size of what is new)."""
    exchanges: list[list[dict[str, Any]]] = []
    system, request = "", ""
    for e in episodes:
        msgs = e.messages
        for i, m in enumerate(msgs):
            if m.get("role") == "system" and not system:
                system = str(m.get("content") or "")
            if m.get("role") == "human" and not request:
                request = str(m.get("content") or "")
            if m.get("role") == "ai" and m.get("tool_calls"):
                ids = {c.get("id") for c in m["tool_calls"]}
                results = [r for r in msgs[i + 1 :] if r.get("tool_call_id") in ids]
                exchanges.append([m, *results])
    if not exchanges:
        raise RuntimeError("scale bench: the recorded sessions have no tool rounds")
    mw = ContextMiddleware(ContextConfig(), cold_dir=work / "cold")
    history: list[AnyMessage] = [HumanMessage(request, id="h0")]

    def handler(req: ModelRequest[Any]) -> ModelResponse[Any]:
        return ModelResponse(result=[AIMessage("ok")])

    out: dict[int, float] = {}
    samples: list[float] = []
    wanted = set(plan.rounds)
    last = max(plan.rounds)
    for r in range(1, last + 1):
        ahead = [w - r for w in wanted if 0 <= w - r < _CONTEXT_SAMPLES]
        for m in exchanges[(ahead[0] if ahead else r) % len(exchanges)]:
            msg = _to_message(m, r)
            if msg is not None:
                history.append(msg)
        state: dict[str, Any] = {"messages": history}
        req = ModelRequest(
            model=None,  # type: ignore[arg-type]
            messages=list(history),
            system_message=SystemMessage(system),
            tools=[],
            state=state,  # type: ignore[arg-type]
            runtime=None,
        )
        t0 = time.process_time()  # CPU time: other processes on the machine do not count
        update = mw.before_model(state, None)  # type: ignore[arg-type]  # no runtime used
        mw.wrap_model_call(req, handler)
        spent = time.process_time() - t0
        if update and "messages" in update:
            raise RuntimeError("scale bench: the context middleware rewrote the session")
        if ahead:
            samples.append(spent)
        if r in wanted:
            out[r] = statistics.median(samples)
            samples = []
    return out


def memory_entries(episodes: Sequence[Episode], n: int) -> dict[str, MemoryEntry]:
    """``n`` strategies and lessons made of the recorded sessions' words (requests, tools,
    arguments), each distinct."""
    phrases: list[str] = []
    for e in episodes:
        phrases.append(e.query or "")
        for c in e.tool_calls:
            phrases.append(f"{c.name} " + " ".join(str(v) for v in c.args.values()))
    phrases = [p for p in phrases if p.strip()] or ["search items"]
    tools = sorted({c.name for e in episodes for c in e.tool_calls}) or ["item_search"]
    out: dict[str, MemoryEntry] = {}
    for i in range(n):
        phrase = phrases[i % len(phrases)]
        words = phrase.split()
        lo = (i // len(phrases)) % max(1, len(words))
        summary = f"{' '.join(words[lo : lo + 12])} case {i}"
        entry = MemoryEntry(
            kind="strategy" if i % 2 else "lesson",
            query_pattern=f"pattern-{i % 97}",
            summary=summary,
            tool_hints=[tools[i % len(tools)]],
            avoid_hints=[f"avoid {tools[(i + 1) % len(tools)]}"] if i % 2 == 0 else [],
            score=0.3 + (i % 7) / 10,
            confidence=0.3 + (i % 5) / 10,
            created_at=1.0,
            updated_at=1.0,
        )
        out[entry.id] = entry
    return out


def time_memory(
    episodes: Sequence[Episode], work: Path, size: int, plan: Plan
) -> tuple[float, float]:
    """(warm retrieval per request in CPU seconds, cold first retrieval in seconds) at
    ``size`` entries."""
    store = MemoryStore(work / f"mem-{size}.db")
    store.replace(memory_entries(episodes, size), note="scale bench")
    store.close()
    store = MemoryStore(work / f"mem-{size}.db")  # a fresh process's view: nothing cached
    queries = [e.query for e in episodes if e.query] or ["find a cheap item"]
    retriever = MemoryRetriever(store)
    t0 = time.perf_counter()
    retriever.retrieve(queries[0])
    cold = time.perf_counter() - t0
    per: list[float] = []
    for _ in range(plan.reps):
        t0 = time.process_time()  # CPU time: other processes on the machine do not count
        for q in queries:
            retriever.retrieve(q)
        per.append((time.process_time() - t0) / len(queries))
    store.close()
    return statistics.median(per), cold


def time_curation(work: Path, size: int, adds: int = 100) -> dict[str, float]:
    """One curation pass of ``adds`` ADDs over the memory :func:`time_memory` built at
    ``size`` entries, in a fresh store (as an evolve cycle opens it): seconds to read the
    entries, reduce the ops and replace (snapshot + live rows)."""
    store = MemoryStore(work / f"mem-{size}.db")
    t0 = time.perf_counter()
    entries = store.entries()
    t1 = time.perf_counter()
    ops = [
        MemoryOp(
            op="ADD",
            entry=MemoryEntry(
                kind="lesson",
                query_pattern=f"pattern-{n % 97}",
                summary=f"curated lesson {n} for size {size}",
                avoid_hints=[f"curated lesson {n}"],
                references=[f"trace-{n}"],
            ),
        )
        for n in range(adds)
    ]
    reduced = reduce_ops(entries, ops, now=2.0)
    t2 = time.perf_counter()
    store.replace(reduced, note="scale bench curation")
    t3 = time.perf_counter()
    store.close()
    return {"entries": t1 - t0, "reduce": t2 - t1, "replace": t3 - t2, "total": t3 - t0}


def _table(echo: Echo, title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A titled table: the column names, then each row's cells, every cell right-aligned to 10."""
    echo(title)
    for cells in (columns, *rows):
        echo("  " + " ".join(f"{c:>10}" for c in cells))


def run(
    *,
    quick: bool = False,
    plan: Plan | None = None,
    work: Path | None = None,
    echo: Echo = print,
) -> dict[str, float]:
    """Run every stage; returns the numbers of the last line."""
    plan = plan or (Plan.quick() if quick else Plan())
    tmp = Path(tempfile.mkdtemp(prefix="evoharness-scale-")) if work is None else work
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        return _run(plan, tmp, echo)
    finally:
        if work is None:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(plan: Plan, work: Path, echo: Echo) -> dict[str, float]:
    started = time.perf_counter()
    base = work / "recorded.db"
    n_base = record(base, plan.tasks, echo)
    recorded = TraceStore(base)
    episodes = list(LocalTraceSource(recorded).episodes())
    recorded.close()

    # one real cycle over the recorded sessions: the verdicts and routes history replicates
    plugin = load_plugin("shop")
    state_base = work / "state-recorded.db"
    state = EvolveState(state_base)
    memory = MemoryStore(work / "memory-recorded.db")
    recorded = TraceStore(base)
    _cycle(plugin, recorded, state, memory)
    for closeable in (state, memory, recorded):
        closeable.close()

    res = Results()
    main, main_state = work / "traces.db", work / "state.db"
    TraceStore(main).close()
    EvolveState(main_state).close()
    replicas = 0
    for size in plan.store_sizes:
        need = -(-size // n_base)
        t0 = time.perf_counter()
        # two files, two connections: SQLite leaves the GIL while it copies, so both run at once
        with ThreadPoolExecutor(2) as pool:
            copies = [
                pool.submit(replicate, main, base, replicas, need - replicas),
                pool.submit(replicate_state, main_state, state_base, replicas, need - replicas),
            ]
            for done in copies:
                done.result()
        replicas = need
        built = time.perf_counter() - t0
        store = TraceStore(main)
        res.window[size], res.tag[size] = time_reads(store, plan)
        store.close()
        res.cycle[size] = time_cycle(main, base, main_state, work, size, plan)
        echo(
            f"  store of {size:,} traces: built in {built:.1f} s, window "
            f"{res.window[size]:.3f} s, tag {res.tag[size]:.3f} s, cycle {res.cycle[size]:.2f} s"
        )
    for backlog in plan.backlogs:
        res.drain[backlog], records = time_drain(base, work, backlog)
        echo(f"  drained a backlog of {backlog:,} traces ({records:,} records)")
    res.context = time_context(episodes, work, plan)
    for size in plan.memory_sizes:
        res.memory[size], res.memory_cold[size] = time_memory(episodes, work, size, plan)
        res.curation[size] = time_curation(work, size)
        echo(
            f"  memory of {size:,} entries: {res.memory[size] * 1e3:.2f} ms per retrieval, "
            f"curation of 100 ADDs {res.curation[size]['total']:.2f} s"
        )
    return report(res, plan, echo, time.perf_counter() - started)


def report(res: Results, plan: Plan, echo: Echo, seconds: float) -> dict[str, float]:
    """Print the tables and the last line; returns the last line's numbers."""
    sizes, backlogs = list(plan.store_sizes), list(plan.backlogs)
    rounds, msizes = list(plan.rounds), list(plan.memory_sizes)
    table = functools.partial(_table, echo)
    table(
        f"episode reads (newest {plan.window:,}; newest {plan.tag_limit} with a rare tag)",
        ("traces", "window s", "tag s"),
        [(f"{s:,}", f"{res.window[s]:.3f}", f"{res.tag[s]:.3f}") for s in sizes],
    )
    table(
        f"cycle over {plan.batch} new episodes (judge, route, curate) at growing history",
        ("history", "cycle s"),
        [(f"{s:,}", f"{res.cycle[s]:.2f}") for s in sizes],
    )
    table(
        "export drain (pending -> mark_exported, every kind, no network)",
        ("backlog", "drain s", "ms/trace"),
        [(f"{b:,}", f"{res.drain[b]:.2f}", f"{res.drain[b] / b * 1e3:.3f}") for b in backlogs],
    )
    table(
        "context middleware per model call (before_model + wrap_model_call)",
        ("round", "ms/call"),
        [(f"{r:,}", f"{res.context[r] * 1e3:.3f}") for r in rounds],
    )
    table(
        "memory retrieval (top-k strategies + lessons for a shop request)",
        ("entries", "warm ms", "cold ms"),
        [
            (f"{m:,}", f"{res.memory[m] * 1e3:.3f}", f"{res.memory_cold[m] * 1e3:.1f}")
            for m in msizes
        ],
    )
    stages = ("entries", "reduce", "replace", "total")
    table(
        "curation of 100 ADDs in a fresh store (read entries, reduce, replace + snapshot)",
        ("entries", "read s", "reduce s", "replace s", "total s"),
        [(f"{m:,}", *(f"{res.curation[m][k]:.2f}" for k in stages)) for m in msizes],
    )
    out = {
        "read_exp": max(
            fit_exponent(sizes, [res.window[s] for s in sizes]),
            fit_exponent(sizes, [res.tag[s] for s in sizes]),
        ),
        "cycle_history_exp": fit_exponent(sizes, [res.cycle[s] for s in sizes]),
        "context_round_exp": fit_exponent(rounds, [res.context[r] for r in rounds]),
        "memory_exp": fit_exponent(msizes, [res.memory[m] for m in msizes]),
        "read_100k_window_s": res.window[sizes[-1]],
    }
    drain_exp = fit_exponent(backlogs, [res.drain[b] for b in backlogs])
    echo(
        f"export drain time ~ backlog^{drain_exp:.2f} (1.0 = linear); largest store "
        f"{sizes[-1]:,} traces; {seconds:.0f} s in all"
    )
    echo(" ".join(f"{k}={v:.3f}" for k, v in out.items()))
    return out
