"""Prompt drafts from traces alone: a plugin without a run side (refund_desk: a checker, no
tasks to replay) still gets its bad cases clustered and a draft prompt version, and is told
that only a staged rollout can prove it."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest
from refund_desk import build_agent, serve, stores

from evoharness.evolve.cli import main
from evoharness.evolve.judging.state import EvolveState
from evoharness.evolve.prompting import SimulatedReflector, run_prompt_layer
from evoharness.harness.tracing import TraceStore
from evoharness.sdk.prompts import RegistryPromptStore
from evoharness.sdk.registry import open_registry

ENV = "refund_desk:environment"
RULE = "Call check_refund_policy before issue_refund."


@pytest.fixture
def judged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Six refunds that skip the policy check, judged and routed (``evolve judge`` and
    ``evolve route``: no cycle has decided layers, so every cluster is the prompt layer's)."""
    monkeypatch.chdir(tmp_path)
    traces_db, registry_db = stores(tmp_path)
    store, registry = TraceStore(traces_db), open_registry(registry_db)
    serve(build_agent(store, registry), 6)
    assert store.flush()
    store.close()
    registry.close()
    where = ["--db", str(traces_db), "--state", "evolve.db"]
    assert main(["evolve", "judge", *where, "--env", ENV]) == 0
    assert main(["evolve", "route", *where]) == 0
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("You handle refund requests.")
    create = ["prompts", "create", "refunds", "--file", str(prompt), "--activate"]
    assert main([*create, "--registry", str(registry_db)]) == 0
    return {"registry": registry_db, "state": tmp_path / "evolve.db"}


def test_no_evaluate_drafts_a_version_from_traces_alone(
    judged: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    args = ["prompt-evolve", "propose", "--env", ENV, "--prompt", "refunds"]
    args += ["--registry", str(judged["registry"]), "--state", str(judged["state"])]
    assert main([*args, "--no-evaluate"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "policy_checked/refund (6)" in out  # clustered from the traces
    assert "proposed v2" in out and "only a staged rollout can prove it" in out
    assert "evoharness prompts rollout refunds 2" in out
    with open_registry(judged["registry"]) as registry:
        store = RegistryPromptStore(registry)
        assert store.get("refunds").version == 1  # a draft: nothing went live
        assert RULE in store.get("refunds", 2).render()


def test_without_a_run_side_the_layer_drafts_even_when_asked_to_evaluate(
    judged: dict[str, Path],
) -> None:
    state = EvolveState(judged["state"])
    with open_registry(judged["registry"]) as registry, closing(state):
        report = run_prompt_layer(
            registry=registry,
            prompt="refunds",
            env=ENV,
            packages=state.pool("lesson_candidate"),
            val=("val", []),
            guard=("guard", []),
            results=judged["state"].parent / "eval.db",
            reflector=SimulatedReflector(),
            evaluate=True,
        )
    (p,) = report.proposals
    assert p.status == "proposed" and p.evaluation is None and p.experiment_id is None
    assert p.rules == [RULE] and p.version == 2
    assert "no run side" in report.note and "staged rollout" in report.note


def test_a_prompt_must_exist_when_there_is_no_run_side_to_import_one_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["prompt-evolve", "propose", "--env", ENV, "--prompt", "refunds", "--no-evaluate"]
    assert main([*args, "--registry", "r.db", "--state", "s.db"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "has no active version" in err and "evoharness prompts create refunds" in err
