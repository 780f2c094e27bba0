"""One trace contract: every schema field round-trips through SQLite and through Langfuse.

Values are generated from the schema's annotations, so a field added to the schema is
covered here without editing this file; the subclass test shows that one field added to a
model derives its column, write tuple, upsert and migration.
"""

from __future__ import annotations

import json
import sqlite3
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel

from evoharness.evolve.episodes.traces import EpisodeFilter, LangfuseTraceSource, LocalTraceSource
from evoharness.harness.tracing import RunInfo, TraceStore, root_span_id, trace_id_for
from evoharness.harness.tracing.langfuse_export import LangfuseExporter
from evoharness.harness.tracing.schema import (
    SCHEMA_VERSION,
    Column,
    Observation,
    Score,
    Trace,
    TraceInfo,
    Usage,
)
from evoharness.harness.tracing.store import STORE_VERSION, TableSpec
from evoharness.sdk.testing.langfuse_standin import LangfuseStandIn

TID = trace_id_for("contract")
FIXED = {"id", "trace_id", "schema_version", "parent_id", "observation_id", "type"}


def sample(annotation: Any, name: str) -> Any:
    """A non-default value for an annotation (``X | None`` -> a value of ``X``)."""
    members = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return sample(members[0], name)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return typing.get_args(annotation)[-1]
    if origin is list:
        return [sample(typing.get_args(annotation)[0], name)]
    if origin is dict:
        return {f"k-{name}": sample(typing.get_args(annotation)[1], name)}
    if annotation is str:
        return f"v-{name}"
    if annotation is float:
        return 1234.5
    if annotation is int:
        return 7
    if annotation is Usage:
        return Usage(input_tokens=3, output_tokens=2, total_tokens=5, cached_input_tokens=1)
    return {"any": [name, 1]}  # Any


def full(model: type[BaseModel], **fixed: Any) -> dict[str, Any]:
    """Every field of ``model`` set to a non-default value (``fixed`` wins)."""
    values = {
        name: sample(info.annotation, name)
        for name, info in model.model_fields.items()
        if name not in FIXED
    }
    return {**values, **fixed}


def test_run_info_is_the_trace_info() -> None:
    assert issubclass(RunInfo, TraceInfo)
    assert set(RunInfo.model_fields) == set(TraceInfo.model_fields)
    assert {"prompt_version", "rollout_arm", "adapter_version", "artifacts"} <= set(
        Trace.model_fields
    )


def test_every_field_round_trips_through_sqlite(tmp_path: Path) -> None:
    trace = Trace.model_validate(full(Trace, id=TID, end_time=1300.0, start_time=1200.0))
    root = root_span_id(TID)
    obs = Observation.model_validate(
        full(Observation, id=root, trace_id=TID, type="agent", start_time=1200.0)
    )
    score = Score.model_validate(
        full(Score, id="s1", trace_id=TID, observation_id=root, data_type="NUMERIC")
    )
    store = TraceStore(tmp_path / "t.db", masker=None)
    store.put_trace(trace)
    store.put_observation(obs)
    store.put_score(score)
    assert store.flush(10)
    assert store.trace(TID) == trace
    assert store.observations(TID) == [obs]
    assert store.scores(TID) == [score]
    (episode,) = LocalTraceSource(store).episodes(
        EpisodeFilter(
            artifacts=trace.artifacts,
            rollout_arm=trace.rollout_arm,
            adapter_version=trace.adapter_version,
            tags=trace.tags,
        )
    )
    assert episode.artifacts == trace.artifacts and episode.rollout_arm == trace.rollout_arm
    store.close()


def test_every_field_round_trips_through_langfuse(tmp_path: Path) -> None:
    trace = Trace.model_validate(full(Trace, id=TID, start_time=1200.0, end_time=1300.0))
    root = root_span_id(TID)
    child = "00000000000000c1"
    observations = [
        Observation.model_validate(
            full(Observation, id=root, trace_id=TID, type="agent", start_time=1200.0)
        ),
        Observation.model_validate(
            full(
                Observation,
                id=child,
                trace_id=TID,
                parent_id=root,
                type="generation",
                start_time=1200.123456789,
            )
        ),
    ]
    score = Score.model_validate(
        full(Score, id="s1", trace_id=TID, observation_id=child, data_type="NUMERIC")
    )
    store = TraceStore(tmp_path / "t.db")
    store.put_trace(trace)
    for o in observations:
        store.put_observation(o)
    store.put_score(score)
    assert store.flush(10)
    with LangfuseStandIn() as lf:
        exporter = LangfuseExporter(
            store, public_key="pk-lf-contract", secret_key="sk-lf-contract", base_url=lf.base_url
        )
        assert exporter.drain(20)
        source = LangfuseTraceSource(exporter.api)
        from evoharness.harness.tracing.langfuse_codec import (
            observation_from_api,
            score_from_api,
            trace_from_root,
        )

        page = exporter.api.observations.get_many(trace_id=TID, parse_io_as_json=True)
        back = sorted((observation_from_api(o) for o in page.data), key=lambda o: o.start_time)
        roots = [o for o in page.data if o.parent_observation_id is None]
        scores = exporter.api.scores.get_many(trace_id=TID)
        assert trace_from_root(roots[0]) == store.trace(TID)
        assert [score_from_api(s, TID) for s in scores.data] == [score]
        remote = list(source.episodes())
        exporter.stop()
    assert back == store.observations(TID)
    assert [e.model_dump() for e in remote] == [
        e.model_dump() for e in LocalTraceSource(store).episodes()
    ]
    store.close()


class _Experimental(Trace):
    """A test-only trace with one more field: the only edit adding a field takes."""

    experiment: Annotated[str | None, Column(index=True)] = None


def test_one_field_added_derives_column_tuple_upsert_and_migration(tmp_path: Path) -> None:
    old, new = TableSpec(Trace, "traces", seq=True), TableSpec(_Experimental, "traces", seq=True)
    assert [c.name for c in new.columns] == [*(c.name for c in old.columns), "experiment"]
    assert "experiment=excluded.experiment" in new.upsert_sql
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    for stmt in old.create_sql():
        conn.execute(stmt)
    data = Trace(id=TID, run_id="r", start_time=1.0, tags=["a"]).model_dump(mode="json")
    data["experiment"] = "exp-1"
    conn.execute(old.upsert_sql, old.row(data, json.dumps(data), 1.0))
    assert new.sync(conn) == ["traces.experiment"]  # the migration: column added, backfilled
    assert conn.execute("SELECT experiment FROM traces").fetchone() == ("exp-1",)
    data["experiment"] = "exp-2"
    conn.execute(new.upsert_sql, new.row(data, json.dumps(data), 2.0))
    assert conn.execute("SELECT experiment, seq FROM traces").fetchone() == ("exp-2", 2)
    assert new.sync(conn) == []


V1_SQL = """
CREATE TABLE traces (
  id TEXT PRIMARY KEY, run_id TEXT, name TEXT, status TEXT, start_time REAL, end_time REAL,
  user_id TEXT, session_id TEXT, thread_id TEXT, environment TEXT, tags TEXT,
  prompt_name TEXT, prompt_version TEXT, policy_version TEXT, parent_trace_id TEXT,
  body TEXT NOT NULL, updated_at REAL NOT NULL, exported_at REAL
);
CREATE TABLE observations (
  id TEXT PRIMARY KEY, trace_id TEXT NOT NULL, parent_id TEXT, type TEXT, name TEXT,
  start_time REAL, body TEXT NOT NULL, updated_at REAL NOT NULL, exported_at REAL
);
CREATE TABLE scores (
  id TEXT PRIMARY KEY, trace_id TEXT NOT NULL, name TEXT, value TEXT, source TEXT,
  body TEXT NOT NULL, updated_at REAL NOT NULL, exported_at REAL
);
CREATE TABLE messages (hash TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE dead_letter (rowid INTEGER PRIMARY KEY, kind TEXT, body TEXT, error TEXT, at REAL);
"""


def test_a_version_1_store_opens_and_migrates(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(V1_SQL)
        body = {"id": TID, "run_id": "r", "start_time": 1.0, "status": "ok", "tags": ["x"]}
        body["schema_version"] = 1
        conn.execute(
            "INSERT INTO traces VALUES (?,?,?,?,?,NULL,NULL,NULL,NULL,'default',?,NULL,NULL,"
            "NULL,NULL,?,1.0,NULL)",
            (TID, "r", "agent", "ok", 1.0, '["x"]', json.dumps(body)),
        )
    store = TraceStore(path)
    assert store.trace(TID) == Trace(id=TID, run_id="r", start_time=1.0, status="ok", tags=["x"])
    assert [t.id for t in store.query(EpisodeFilter(tags=["x"]).query())] == [TID]
    with sqlite3.connect(path) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM store_schema ORDER BY 1")]
        columns = {r[1] for r in conn.execute("PRAGMA table_info(traces)")}
    assert versions == list(range(1, STORE_VERSION + 1))
    assert {"rollout_arm", "adapter_version", "seq"} <= columns
    assert Trace.model_fields["schema_version"].default == SCHEMA_VERSION
    TraceStore(path)  # opening again changes nothing
