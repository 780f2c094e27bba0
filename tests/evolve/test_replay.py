"""P1 replay: the ``replay`` pool's bad cases run again with a replay model (scripted here);
a replay enters the SFT pool only when its judge total is >= 0.75, it beats the original by
>= 15 points, its format is 100% valid and it is <= 16K tokens. Replays are traced into their
own store, never the app's, and a second pass reads them back instead of running again."""

from __future__ import annotations

import asyncio
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from calc_replay import sloppy_solver, solver
from calc_world import CalcDesk, environment, make_tasks

from evoharness.evolve.cli import main
from evoharness.evolve.cycle import run_cycle
from evoharness.evolve.environment import build_judge, build_proposer, build_rubrics
from evoharness.evolve.episodes.traces import LocalTraceSource
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.routing.replay import ReplayGate, ReplayReport, replay_bad_cases
from evoharness.harness.tracing import Tracer, TraceStore
from evoharness.sdk.memory import MemoryStore
from evoharness.sdk.runner import run_tasks
from evoharness.sdk.testing import ScriptedChatModel


@pytest.fixture
def routed(tmp_path: Path) -> dict[str, Path]:
    """Twelve calculator runs (two correct, ten bad in five ways), judged and routed."""
    desk = CalcDesk()
    store = TraceStore(tmp_path / "traces.db")
    asyncio.run(
        run_tasks(
            desk,
            make_tasks(12),
            model_factory=desk.offline_model,
            middleware_factory=desk.harness_middleware,
            tracer=Tracer(store),
            tags=["calc"],
        )
    )
    assert store.flush()
    state = EvolveState(tmp_path / "evolve.db")
    memory = MemoryStore(tmp_path / "memory.db")
    asyncio.run(
        run_cycle(
            LocalTraceSource(store),
            grader=build_judge(environment),
            rubrics=build_rubrics(environment),
            state=state,
            memory=memory,
            proposer=build_proposer(environment),
            scores_to=store,
        )
    )
    assert len(state.pool("replay")) == 10
    for closable in (memory, state, store):
        closable.close()
    return {"traces": tmp_path / "traces.db", "state": tmp_path / "evolve.db"}


def replay(
    paths: dict[str, Path], model: ScriptedChatModel, replays: Path, **kw: Any
) -> ReplayReport:
    with closing(EvolveState(paths["state"])) as state, closing(TraceStore(replays)) as store:
        return asyncio.run(
            replay_bad_cases(
                state,
                env=CalcDesk(),
                model=model,
                grader=build_judge(environment),
                rubrics=build_rubrics(environment),
                store=store,
                **kw,
            )
        )


def test_replays_that_pass_the_gate_enter_the_sft_pool(
    routed: dict[str, Path], tmp_path: Path
) -> None:
    model = solver()
    report = replay(routed, model, tmp_path / "replays.db")
    assert (report.cases, report.replayed, report.accepted) == (10, 10, 10)
    for o in report.outcomes:
        assert o.total == 1.0 and o.original_total <= 0.85 and o.gain is not None
        assert o.gain >= 0.15 and o.format_valid and 0 < o.tokens <= 16_000
    with closing(EvolveState(routed["state"])) as state:
        sft = [p for p in state.pool("sft") if p.get("replay_of")]
        bad = {p["trace_id"] for p in state.pool("replay")}
    assert {p["replay_of"] for p in sft} == bad
    row = sft[0]
    assert row["replay_model"] == "calc-solver (simulated)"
    assert [m["role"] for m in row["messages"]][-1] == "assistant"
    assert {t["function"]["name"] for t in row["tools"]} == {"add", "lookup_rate"}
    assert row["verdict"]["total"] == 1.0 and row["trace_id"] not in bad
    # the replays live in their own store; the app's holds only its own twelve runs
    with closing(TraceStore(routed["traces"])) as app:
        assert len(app.traces()) == 12
    with closing(TraceStore(tmp_path / "replays.db")) as replays:
        runs = replays.traces()
        assert len(runs) == 10 and all("replay" in t.tags for t in runs)
        assert {t.metadata["replay_of"] for t in runs} == bad
    # a second pass reads the replays back: nothing runs again, nothing is added twice
    calls = len(model.calls)
    again = replay(routed, model, tmp_path / "replays.db")
    assert (again.replayed, again.resumed, again.accepted) == (0, 10, 10)
    assert len(model.calls) == calls
    with closing(EvolveState(routed["state"])) as state:
        assert len([p for p in state.pool("sft") if p.get("replay_of")]) == 10


def test_a_replay_that_does_not_beat_the_original_stays_out(
    routed: dict[str, Path], tmp_path: Path
) -> None:
    same = ScriptedChatModel(policy=CalcDesk().offline_model().policy, model_name="same")
    report = replay(routed, same, tmp_path / "replays.db")
    assert report.accepted == 0 and report.replayed == 10
    assert all(not o.accepted and o.total is not None for o in report.outcomes)
    reasons = {o.reason.split(" ")[0] for o in report.outcomes}
    assert reasons == {"total"}  # as bad as the original: below 0.75
    with closing(EvolveState(routed["state"])) as state:
        assert not any(p.get("replay_of") for p in state.pool("sft"))


def test_the_gain_the_format_and_the_length_are_gates_too(
    routed: dict[str, Path], tmp_path: Path
) -> None:
    sloppy = replay(routed, sloppy_solver(), tmp_path / "sloppy.db")
    assert sloppy.accepted == 0
    for o in sloppy.outcomes:  # the right answer in the end, but a call to no offered tool
        assert o.total is not None and o.total >= 0.75 and not o.format_valid
        assert "format not valid" in o.reason and "multiply" in o.reason
    short = replay(routed, solver(), tmp_path / "short.db", gate=ReplayGate(max_tokens=40))
    assert short.accepted == 0
    assert all(
        o.format_valid and o.tokens > 40 and "tokens > 40" in o.reason for o in short.outcomes
    )
    high = replay(routed, solver(), tmp_path / "high.db", gate=ReplayGate(min_gain=1.0))
    gains = {o.trace_id: o for o in high.outcomes}
    assert high.accepted == sum(o.original_total == 0.0 for o in gains.values()) > 0
    assert all("gain" in o.reason for o in gains.values() if o.original_total > 0)


def test_evolve_replay_cli(
    routed: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["evolve", "replay", "--env", "calc_world:environment"]
    args += ["--state", str(routed["state"]), "--replay-db", str(tmp_path / "r.db")]
    assert main([*args, "--model-factory", "calc_replay:solver"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "cases=10 replayed=10 resumed=0 accepted=10" in out
    # no replay model: the message says how to give one
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--model NAME" in err and "--model-factory" in err
