"""The whole loop from the command line, on an app plugin that is not the shop (returns_app:
its own tools, checker, case key and run side; a SIMULATED model served through the real
serving pool):

sessions -> ``evolve cycle`` (a memory snapshot is proven offline, then rolled out; the
rollout's decision promotes it; memory reaches the next sessions through the door) -> the
cycle decides: memory fixed refunds (keep), cancellations go to the prompt layer ->
``prompt-evolve propose`` drafts on that cluster only -> ``prompts rollout`` -> the cycle
decides: training -> ``weights dataset`` (the decided cluster) -> ``train`` (a tiny Llama) ->
``publish`` -> ``gate`` (paired replay) -> ``activate`` -> the next sessions load and are
served by the adapter and record it -> ``weights rollback`` -> the report's layers table
comes from this app's own runs, and the store holds no offline run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import returns_app as app

from evoharness.evolve.cli import main
from evoharness.evolve.routing.layers import latest_decisions
from evoharness.harness.tracing import Trace, TraceStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import RolloutController

ENV = "returns_app:environment"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for module in ("torch", "transformers", "trl", "peft"):
        pytest.importorskip(module, reason="the train extra is not installed (see docs/weights.md)")
    from evoharness.evolve.weights.datasets import tool_schemas
    from evoharness.evolve.weights.tiny import build_tiny_model

    corpus = [json.dumps(tool_schemas(app.TOOLS))] * 3
    corpus += [app.SYSTEM, "Please refund my order 12", "Please cancel my order 13"]
    corpus.append("<tool_call>\n</tool_call> <tool_response>\n</tool_response> Done with")
    return build_tiny_model(tmp_path_factory.mktemp("returns") / "base", corpus)


def cli(*args: str, out: pytest.CaptureFixture[str]) -> str:
    code = main(list(args))
    got = out.readouterr()
    assert code == 0, got.out + got.err
    return got.out


def newest(store: TraceStore, n: int) -> list[Trace]:
    assert store.flush()
    return store.traces(newest_first=False)[-n:]


def calls(store: TraceStore, t: Trace) -> list[str]:
    return [o.name for o in store.observations(t.id) if o.type == "tool"]


def test_the_loop_from_sessions_to_an_adapter_and_back(
    tiny_base: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    app.SERVED.update(base_dir=tiny_base, pool=None)
    db, reg_path = tmp_path / "traces.db", tmp_path / "registry.db"
    stores = ["--db", str(db), "--registry", str(reg_path)]
    evolve = ["--state", "evolve.db", "--env", ENV]
    cycle = ["evolve", "cycle", *stores, *evolve, "--memory-path", "memory.db", "--since-last"]
    cycle += ["--stages", "0.5,1.0", "--min-dwell-s", "0", "--min-tasks", "12"]
    (tmp_path / "system.txt").write_text(app.SYSTEM)
    cli("prompts", "create", app.PROMPT, "--file", "system.txt", "--activate",
        "--registry", str(reg_path), out=capsys)  # fmt: skip

    store, registry = TraceStore(db), open_registry(reg_path)
    agent = app.build_agent(store, registry)
    app.serve(agent, range(24))  # no memory: refunds skip the policy check
    first = newest(store, 24)
    assert all(t.artifacts == {"prompt/returns": "1"} for t in first)

    # cycle 1: lessons for both clusters; the snapshot is a candidate, proven by a paired
    # replay of the app's val split (memory fixes refunds) and rolled out at 50%
    out = cli(*cycle, out=capsys)
    assert "memory v1: rollout: gate passed" in out
    assert registry.labels("memory", "default") == {"candidate": 1}
    exp = RolloutController(registry).running("default", kind="memory")
    assert exp is not None and exp.control.version is None

    # sessions: each user sticks to an arm; the candidate arm gets the lesson via the door
    app.serve(agent, range(100, 180), day="d1")
    rolled = newest(store, 80)
    arms = {t.user_id: t.metadata["rollouts"][exp.id] for t in rolled}
    assert set(arms.values()) == {"control", "v1"}
    for t in rolled:
        has = t.artifacts.get("memory/default") == "1"
        assert has == (arms[t.user_id] == "v1")
        if t.input and "refund" in str(t.input):
            assert ("check_refund_policy" in calls(store, t)) == has

    # cycle 2 judges them; the engine's decision on the judged arms promotes the snapshot
    cli(*cycle, out=capsys)
    out = cli("rollout", "status", "memory", "default", "--db", str(db), "--apply",
              "--registry", str(reg_path), out=capsys)  # fmt: skip
    assert "decision: promote" in out, out
    assert registry.labels("memory", "default")["active"] == 1

    # everyone gets the memory now; cycle 3 decides: memory fixed refunds, cancellations
    # (a habit no lesson changes) go to the prompt layer
    app.serve(agent, range(200, 230), day="d2")
    assert all(t.artifacts.get("memory/default") == "1" for t in newest(store, 30))
    cli(*cycle, out=capsys)
    decisions = {d.cluster: d.action for d in latest_decisions(registry)}
    assert decisions["policy_checked | refund"] == "keep"
    assert decisions["cancel_confirmed | cancel"] == "prompt_proposal"

    # the prompt layer proposes on the decided cluster only (never the one memory fixed)
    out = cli("prompt-evolve", "propose", "--env", ENV, "--prompt", app.PROMPT,
              "--search", "direct", "--no-evaluate", *stores, "--state", "evolve.db",
              out=capsys)  # fmt: skip
    assert "cancel_confirmed/cancel" in out and "policy_checked" not in out
    assert "Call confirm_cancellation before cancel_order." in out
    cli("prompts", "rollout", app.PROMPT, "2", "--stages", "0.5,1.0", "--min-dwell-s", "0",
        "--registry", str(reg_path), out=capsys)  # fmt: skip
    app.serve(agent, range(300, 340), day="d3")
    assert {t.prompt_version for t in newest(store, 40)} == {"1", "2"}

    # cycle 4: memory was tried, the prompt too (two versions): train
    cli(*cycle, out=capsys)
    training = [d for d in latest_decisions(registry) if d.action == "training_dataset"]
    assert [d.cluster for d in training] == ["cancel_confirmed | cancel"]
    cli("prompts", "rollback", app.PROMPT, "--registry", str(reg_path), out=capsys)

    # the weights layer on the decided cluster: dataset -> train -> publish -> gate
    weights = ["--policy", app.POLICY, "--registry", str(reg_path)]
    out = cli("weights", "dataset", *weights, "--db", str(db), "--state", "evolve.db",
              "--env", ENV, "--base-model", str(tiny_base), out=capsys)  # fmt: skip
    assert "training selection: 1 cluster(s)" in out and "cancel_confirmed | cancel" in out
    cli("weights", "train", *weights, "--steps", "2", "--max-length", "2048", out=capsys)
    cli("weights", "publish", *weights, out=capsys)
    out = cli("weights", "gate", *weights, "--serving", "returns_app:serving",
              "--min-tasks", "12", out=capsys)  # fmt: skip
    assert "gate passed" in out and "exact McNemar" in out, out
    assert registry.labels("adapter", app.POLICY) == {"candidate": 1}
    out = cli("weights", "run", *weights, out=capsys)  # every stage done: nothing again
    assert "skipped (done before): dataset, train, publish, gate" in out

    # one activation step: the registry's label; the next sessions load the adapter into
    # the pool, are served by it (cancellations confirmed) and record it
    cli("weights", "activate", *weights, "--direct", out=capsys)
    app.serve(agent, range(400, 410), day="d4")
    served = newest(store, 10)
    assert all(t.artifacts["adapter/returns-policy"] == "1" for t in served)
    assert all(t.adapter_version == "returns-policy-v1" for t in served)
    assert "returns-policy-v1" in app.pool().adapters
    cancels = [t for t in served if "cancel" in str(t.input)]
    assert cancels and all("confirm_cancellation" in calls(store, t) for t in cancels)
    out = cli("weights", "status", *weights, out=capsys)
    assert "returns-policy-v1" in out and "active" in out

    # rollback: the next session is served by the base model again
    cli("weights", "rollback", *weights, out=capsys)
    app.serve(agent, [503], day="d5")  # 503: a cancellation the habit does not confirm
    (back,) = newest(store, 1)
    assert "adapter/returns-policy" not in back.artifacts
    assert "confirm_cancellation" not in calls(store, back)

    # the report's layers table, from this app's own judged runs
    cli(*cycle, out=capsys)
    html = tmp_path / "report.html"
    cli("report", "--out", str(html), *stores, out=capsys)
    text = html.read_text()
    assert "live: success and P0 rate per layer" in text
    assert ">+memory<" in text and ">+SFT<" in text and ">baseline<" in text
    # the store holds the app's sessions only: no evaluation, gate or search run
    everything = store.traces(newest_first=False)
    assert everything and all(
        app.TAG in t.tags for t in everything if "evoharness.internal" not in t.tags
    )
    store.close()
    registry.close()
