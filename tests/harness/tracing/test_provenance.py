"""Provenance: offline runs are filtered in SQL; readers see one judge's scores, by one rule."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from evoharness.harness.tracing import Score, TraceQuery, TraceStore
from evoharness.harness.tracing.provenance import (
    OFFLINE_TAG,
    eval_store_path,
    judge_of,
    judge_score_id,
    judge_source,
    resolve_scores,
)

T = "0" * 32


def _score(name: str, value: float | str, source: str, at: float = 1.0) -> Score:
    return Score(id=f"{source}-{name}", trace_id=T, name=name, value=value, source=source,
                 created_at=at)  # fmt: skip


def test_the_eval_store_lives_beside_the_apps_store() -> None:
    assert eval_store_path(".evoharness/traces.db") == Path(".evoharness/traces.eval.db")
    assert eval_store_path("/srv/app/traces.sqlite") == Path("/srv/app/traces.eval.sqlite")
    assert eval_store_path("traces") == Path("traces.eval.db")


def test_judge_identity_round_trips() -> None:
    assert judge_of(judge_source("desk")) == "desk"
    assert judge_of("judge") is None and judge_of("env") is None and judge_of("judge:") is None
    assert judge_score_id(T, "desk", "total") != judge_score_id(T, "generic", "total")


def test_readers_see_one_judge_by_one_rule() -> None:
    scores = [
        _score("total", 0.4, "judge", at=0.0),  # before judges had an identity
        _score("total", 1.0, judge_source("desk"), at=1.0),
        _score("total", 0.5, judge_source("generic"), at=5.0),
        _score("total", 0.9, judge_source("other"), at=3.0),
        _score("env_success", 1.0, "env"),
    ]
    tagged = resolve_scores(scores, tags=["desk"])
    assert (tagged.judge, tagged.values) == ("desk", {"total": 1.0, "env_success": 1.0})
    assert tagged.judges == {"desk": {"total": 1.0}, "generic": {"total": 0.5},
                             "other": {"total": 0.9}}  # fmt: skip
    # no tag of a judge: the newest judge of a specific environment, never generic over it
    assert resolve_scores(scores).judge == "other"
    assert resolve_scores(scores[:3]).judge == "desk"
    assert resolve_scores([scores[0], scores[2]]).values["total"] == 0.5
    # configured: that judge only; legacy scores fill in where it wrote nothing
    assert resolve_scores(scores, judge="generic").values["total"] == 0.5
    missing = resolve_scores(scores, judge="nobody")
    assert missing.judge is None and missing.values["total"] == 0.4
    assert resolve_scores(scores[:1]).values == {"total": 0.4}


def test_offline_runs_are_left_out_in_sql_by_primary_key(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "t.db")
    for i in range(6):
        store.put_trace(
            {
                "id": f"{i:032x}",
                "run_id": f"r{i}",
                "start_time": float(i),
                "status": "ok",
                "tags": ["app", *([OFFLINE_TAG] if i % 3 == 0 else [])],
            }
        )
    assert store.flush(10)
    try:
        production = store.query(TraceQuery(tags=["app"], without_tags=[OFFLINE_TAG]))
        assert [t.run_id for t in production] == ["r1", "r2", "r4", "r5"]
        assert len(store.query(TraceQuery(tags=["app"]))) == 6
        sql, args = TraceQuery(without_tags=[OFFLINE_TAG], newest_first=True, limit=5).sql()
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "t.db") as conn:
        plan = " ".join(
            str(r) for r in conn.execute(f"EXPLAIN QUERY PLAN SELECT body FROM traces {sql}", args)
        )
    assert "PRIMARY KEY" in plan and "SCAN g" not in plan
