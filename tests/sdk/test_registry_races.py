"""Read-decide-write operations stay atomic when several real processes race, on both backends.

Every test starts ``WORKERS`` Python processes that each open the registry, then play
``ROUNDS`` rounds: in each round all of them wait until the test releases them at the same
instant (a start file per round), run one operation and print what happened as a JSON line.
Each round works on its own prompt (``shop-<round>``), prepared before the processes start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore
from evoharness.sdk.prompts.store import ACTIVE, CANDIDATE
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import RolloutController
from evoharness.sdk.rollout.experiment import ROLLOUT_KIND

from .test_registry import postgres_db, registry_url  # noqa: F401  (two-backend fixtures)

pytestmark = pytest.mark.slow
ROUNDS = 4

_WORKER = """
import json, sys, time
from pathlib import Path
from evoharness.harness.errors import EvoharnessError
from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import RolloutController

url, op, tag, folder, rounds = sys.argv[1:6]
folder = Path(folder)
reg = open_registry(url)
store, ctl = RegistryPromptStore(reg), RolloutController(reg)


def run(prompt):
    if op == "create":
        v = store.create(prompt, PromptTemplate.from_text(f"Be brief ({tag})."), author=tag)
        return {"version": v.version, "semver": v.semver}
    if op == "start":
        return {"experiment": ctl.start(prompt, 2, min_dwell_s=0, actor=tag).id}
    if op == "promote":
        return {"decision": ctl.promote(prompt, reason=tag, actor=tag).reason}
    if op == "rollback":
        return {"decision": ctl.rollback(prompt, reason=tag, actor=tag).reason}
    raise SystemExit(f"unknown op {op}")


for r in range(int(rounds)):
    (folder / f"ready-{r}-{tag}").touch()
    while not (folder / f"go-{r}").exists():  # released together
        time.sleep(0.002)
    try:
        out = run(f"shop-{r}")
    except EvoharnessError as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps({"round": r, "tag": tag, **out}), flush=True)
reg.close()
"""


def race(url: str, folder: Path, ops: Sequence[str]) -> list[list[dict[str, Any]]]:
    """Run one process per entry of ``ops`` for ``ROUNDS`` rounds; each round's results."""
    tags = [f"{op}{i}" for i, op in enumerate(ops)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, op, tag, str(folder), str(ROUNDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for op, tag in zip(ops, tags, strict=True)
    ]
    for r in range(ROUNDS):
        while not all((folder / f"ready-{r}-{t}").exists() for t in tags):
            if any(p.poll() is not None for p in procs):
                break
            threading.Event().wait(0.005)
        (folder / f"go-{r}").touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), [err for _, err in outs]
    lines = [json.loads(line) for out, _ in outs for line in out.splitlines()]
    return [[x for x in lines if x["round"] == r] for r in range(ROUNDS)]


def prepare(url: str, setup: Callable[[RegistryPromptStore, RolloutController, str], None]) -> None:
    with open_registry(url) as reg:
        store, ctl = RegistryPromptStore(reg), RolloutController(reg)
        for r in range(ROUNDS):
            setup(store, ctl, f"shop-{r}")


def two_versions(store: RegistryPromptStore, _: RolloutController, prompt: str) -> None:
    store.promote(prompt, store.create(prompt, PromptTemplate.from_text("v1")).version)
    store.create(prompt, PromptTemplate.from_text("v2"))


def test_processes_creating_versions_get_distinct_versions_and_semvers(
    registry_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    prepare(
        registry_url,
        lambda store, _, p: store.create(p, PromptTemplate.from_text("v1"), semver="1.0.0"),
    )
    rounds = race(registry_url, tmp_path, ["create"] * 4)
    with open_registry(registry_url) as reg:
        store = RegistryPromptStore(reg)
        for r, results in enumerate(rounds):
            assert sorted(x["version"] for x in results) == [2, 3, 4, 5], results
            assert sorted(x["semver"] for x in results) == ["1.1.0", "1.2.0", "1.3.0", "1.4.0"]
            stored = store.versions(f"shop-{r}")
            # each version's semver is its parent's bumped: the parent is the version before
            assert [v.parent for v in stored] == [None, 1, 2, 3, 4]
            assert [v.semver for v in stored] == ["1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.4.0"]


def test_processes_starting_one_rollout_start_exactly_one(
    registry_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    prepare(registry_url, two_versions)
    rounds = race(registry_url, tmp_path, ["start"] * 4)
    with open_registry(registry_url) as reg:
        for r, results in enumerate(rounds):
            started = [x for x in results if "experiment" in x]
            refused = [x for x in results if "error" in x]
            assert len(started) == 1 and len(refused) == 3, results
            assert {x["error"] for x in refused} == {"ConfigError"}
            assert all("already has a running rollout" in x["message"] for x in refused)
            states = reg.versions(ROLLOUT_KIND, f"shop-{r}")
            assert [s.content["id"] for s in states] == [started[0]["experiment"]]
            assert reg.labels("prompt", f"shop-{r}") == {ACTIVE: 1, CANDIDATE: 2}


def test_promote_racing_rollback_ends_in_one_consistent_state(
    registry_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    prepare(registry_url, lambda s, c, p: (two_versions(s, c, p), c.start(p, 2, min_dwell_s=0)))
    rounds = race(registry_url, tmp_path, ["promote", "rollback"])
    with open_registry(registry_url) as reg:
        ctl = RolloutController(reg)
        for r, results in enumerate(rounds):
            prompt = f"shop-{r}"
            by_op = {x["tag"].rstrip("0123456789"): x for x in results}
            states = [s.content["status"] for s in reg.versions(ROLLOUT_KIND, prompt)]
            assert states[0] == "running" and len(states) == 2, (states, results)
            labels = reg.labels("prompt", prompt)
            assert CANDIDATE not in labels
            promotes = [
                e for e in reg.events("prompt", prompt) if e.action == "promote" and e.version == 2
            ]
            if states[1] == "rolled_back":  # the rollback came first: nothing left to promote
                assert by_op["promote"].get("error") == "ConfigError", results
                assert labels[ACTIVE] == 1 and promotes == []
            else:  # promoted first, then the rollback restored the version before it
                assert states[1] == "promoted" and len(promotes) == 1, results
                assert "restored v1" in by_op["rollback"]["decision"]
                assert labels[ACTIVE] == 1
            assert ctl.running(prompt) is None
