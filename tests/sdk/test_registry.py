"""The artifact registry on SQLite and on a real PostgreSQL (own database, dropped after)."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evoharness.harness import GuardRule, GuardRuleSet, OutputGuardMiddleware
from evoharness.harness.errors import ConfigError, EvoharnessError, MissingExtraError, RunError
from evoharness.sdk.registry import (
    ActiveArtifact,
    ArtifactNotFound,
    ArtifactVersion,
    GuardRuleVersions,
    Registry,
    RegistryError,
    SQLiteRegistry,
    active_guard_rules,
    content_hash,
    open_registry,
)

POSTGRES_URL = os.environ.get(
    "EVOHARNESS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _with_db(url: str, database: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{database}"


@pytest.fixture(scope="module")
def postgres_db() -> Iterator[str]:
    """A database of our own on the shared server: fails in CI when none answers, skips
    (visibly) elsewhere; dropped at the end."""
    try:
        import psycopg
    except ImportError:
        if _in_ci():
            pytest.fail("psycopg missing in CI: pip install 'evoharness[postgres]'")
        pytest.skip("psycopg not installed: pip install 'evoharness[postgres]'")
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=2)
    except psycopg.Error as exc:
        if _in_ci():
            pytest.fail(f"PostgreSQL is mandatory in CI but {POSTGRES_URL} did not answer: {exc}")
        pytest.skip(f"no PostgreSQL at {POSTGRES_URL} ({exc}); PostgreSQL tests run in CI")
    database = f"evoharness_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f"CREATE DATABASE {database}")
        try:
            yield _with_db(POSTGRES_URL, database)
        finally:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgres"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty registry location per test: a SQLite file, or a PostgreSQL schema of
    its own (search_path) in the module's database."""
    if request.param == "sqlite":
        return str(tmp_path / "registry.db")
    return _own_schema(request.getfixturevalue("postgres_db"))


def _own_schema(database_url: str) -> str:
    """A new schema in the test database; the URL that makes it the search path."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{database_url}?options=-csearch_path%3D{schema}"


@pytest.fixture
def reg(registry_url: str) -> Iterator[Registry]:
    registry = open_registry(registry_url)
    yield registry
    registry.close()


# -- publish, read, list ----------------------------------------------------------------------
def test_publish_get_versions_names_labels(reg: Registry) -> None:
    v1 = reg.publish("prompt", "system", {"text": "Be brief."}, metadata={"semver": "1.0.0"})
    v2 = reg.publish(
        "prompt", "system", {"text": "Be brief and kind."}, author="alice", parent=v1.version
    )
    reg.publish("prompt", "judge", {"text": "Grade it."})
    reg.publish("guard_rules", "shop", {"rules": []})

    assert (v1.version, v2.version) == (1, 2)
    assert v1.content_hash == content_hash({"text": "Be brief."})
    assert v2.author == "alice" and v2.parent == 1 and v2.created_at >= v1.created_at > 0
    assert v2.ref == "prompt/system@v2"
    assert reg.get("prompt", "system") == v2  # latest
    assert reg.get("prompt", "system", 1) == v1
    assert reg.get("prompt", "system", 1).metadata == {"semver": "1.0.0"}
    assert [v.version for v in reg.versions("prompt", "system")] == [1, 2]
    assert reg.versions("prompt", "nothing") == []
    assert reg.names("prompt") == ["judge", "system"]
    assert reg.names("adapter") == []
    assert reg.labels("prompt", "system") == {}
    reg.set_label("prompt", "system", "candidate", 2)
    reg.promote("prompt", "system", 1)
    assert reg.labels("prompt", "system") == {"active": 1, "candidate": 2}
    assert reg.get("prompt", "system", label="candidate").content == {"text": "Be brief and kind."}
    assert isinstance(reg, Registry)


def test_identical_content_to_latest_returns_it(reg: Registry) -> None:
    a = reg.publish("memory", "shop", [{"id": "x", "n": 1}])
    again = reg.publish("memory", "shop", [{"n": 1, "id": "x"}])  # same canonical JSON
    assert again == a and len(reg.versions("memory", "shop")) == 1
    assert [e.action for e in reg.events("memory", "shop")] == ["publish"]
    b = reg.publish("memory", "shop", [])
    back = reg.publish("memory", "shop", [{"id": "x", "n": 1}])  # equal to v1, not the latest
    assert (b.version, back.version) == (2, 3) and back.content_hash == a.content_hash


def test_content_must_be_json_and_parent_must_exist(reg: Registry) -> None:
    with pytest.raises(ConfigError, match="model_dump"):
        reg.publish("prompt", "p", {"when": object()})
    with pytest.raises(ConfigError, match="non-empty"):
        reg.publish("", "p", {})
    with pytest.raises(ArtifactNotFound, match="no version 7"):
        reg.publish("prompt", "p", {"a": 1}, parent=7)
    assert reg.versions("prompt", "p") == []


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_not_stored(reg: Registry, number: float) -> None:
    with pytest.raises(ConfigError, match=r"prompt/p: the content holds .* at \$\.scores\[1\]"):
        reg.publish("prompt", "p", {"scores": [0.5, number]})
    with pytest.raises(ConfigError, match=r"the metadata holds .* at \$\.metrics\.p") as info:
        reg.publish("prompt", "p", {"a": 1}, metadata={"metrics": {"p": number}})
    assert "JSON has no NaN or Infinity" in str(info.value) and info.value.field == "content"
    with pytest.raises(ConfigError, match=r"memory/m: item 'e1' holds .* at \$\.w"):
        reg.publish_changes("memory", "m", {"e1": {"w": number}}, base=None)
    with pytest.raises(ConfigError, match=r"memory/m: the metadata holds"):
        reg.publish_changes("memory", "m", {"e1": {"w": 1}}, base=None, metadata={"x": number})
    assert reg.versions("prompt", "p") == [] and reg.versions("memory", "m") == []
    assert reg.events() == []
    assert reg.publish("prompt", "p", {"scores": [0.5, None, 1e308]}).version == 1


def test_a_transaction_commits_or_undoes_every_call_in_it(reg: Registry) -> None:
    def change_then_fail() -> None:
        with reg.transaction("prompt", "p"):
            v = reg.publish("prompt", "p", {"a": 1})
            reg.promote("prompt", "p", v.version)
            reg.publish("memory", "m", {"b": 2})  # another artifact, same transaction
            raise RuntimeError("changed my mind")

    with pytest.raises(RuntimeError, match="changed my mind"):
        change_then_fail()
    assert reg.versions("prompt", "p") == [] and reg.versions("memory", "m") == []
    assert reg.labels("prompt", "p") == {} and reg.events() == []
    with reg.transaction("prompt", "p"):
        v = reg.publish("prompt", "p", {"a": 1})
        with pytest.raises(ArtifactNotFound):  # a failed call inside undoes only itself
            reg.rollback("prompt", "p")
        with reg.transaction("prompt", "p"):  # blocks nest
            reg.promote("prompt", "p", v.version)
    assert reg.labels("prompt", "p") == {"active": 1}
    assert [e.action for e in reg.events("prompt", "p")] == ["publish", "promote"]


# -- labels, promote, rollback ----------------------------------------------------------------
def test_promote_rollback_walks_back_through_history(reg: Registry) -> None:
    for text in ("one", "two", "three"):
        v = reg.publish("prompt", "p", {"text": text})
        reg.promote("prompt", "p", v.version, reason=f"ship {text}")
    assert reg.get("prompt", "p", label="active").version == 3
    first = reg.rollback("prompt", "p", reason="regression")
    assert (first.version, first.previous, first.action) == (2, 3, "rollback")
    second = reg.rollback("prompt", "p")
    assert (second.version, second.previous) == (1, 2)  # further back, not back to 3
    assert reg.labels("prompt", "p") == {"active": 1}
    with pytest.raises(ArtifactNotFound, match="no earlier version") as err:
        reg.rollback("prompt", "p")
    assert err.value.label == "active"
    reg.promote("prompt", "p", 3)
    assert reg.rollback("prompt", "p").version == 1  # the history is now [1, 3]


def test_labels_are_independent_and_unlabel(reg: Registry) -> None:
    for text in ("a", "b"):
        reg.publish("adapter", "policy", {"path": text})
    reg.promote("adapter", "policy", 1)
    reg.promote("adapter", "policy", 2, label="candidate")
    reg.promote("adapter", "policy", 1, label="candidate")
    assert reg.rollback("adapter", "policy", label="candidate").version == 2
    assert reg.labels("adapter", "policy") == {"active": 1, "candidate": 2}
    unchanged = reg.promote("adapter", "policy", 1)
    assert unchanged.id == 0 and unchanged.reason == "unchanged"
    gone = reg.unlabel("adapter", "policy", "candidate", reason="experiment over")
    assert (gone.action, gone.previous) == ("unlabel", 2)
    assert reg.labels("adapter", "policy") == {"active": 1}
    with pytest.raises(ArtifactNotFound, match="no label 'candidate'"):
        reg.get("adapter", "policy", label="candidate")
    with pytest.raises(ArtifactNotFound, match="no such label"):
        reg.rollback("adapter", "policy", label="candidate")
    with pytest.raises(ArtifactNotFound):
        reg.promote("adapter", "policy", 9)


def test_audit_log_records_every_change(reg: Registry) -> None:
    reg.publish("guard_rules", "shop", {"rules": ["a"]}, author="evolve:cycle")
    reg.publish("guard_rules", "shop", {"rules": ["a"]})  # dedupe: no event
    reg.publish("guard_rules", "shop", {"rules": ["a", "b"]}, author="evolve:cycle")
    reg.promote("guard_rules", "shop", 1, actor="ops")
    cutoff = reg.events()[-1].at
    reg.promote("guard_rules", "shop", 2, actor="evolve:cycle", reason="new rule b")
    reg.set_label("guard_rules", "shop", "candidate", 2, actor="ops")
    reg.rollback("guard_rules", "shop", actor="ops", reason="b over-redacts")
    reg.publish("prompt", "other", {"x": 1})

    log = reg.events("guard_rules", "shop")
    assert [(e.action, e.version, e.label, e.previous, e.actor) for e in log] == [
        ("publish", 1, None, None, "evolve:cycle"),
        ("publish", 2, None, None, "evolve:cycle"),
        ("promote", 1, "active", None, "ops"),
        ("promote", 2, "active", 1, "evolve:cycle"),
        ("label", 2, "candidate", None, "ops"),
        ("rollback", 1, "active", 2, "ops"),
    ]
    assert log[3].reason == "new rule b" and log[5].reason == "b over-redacts"
    assert [e.id for e in log] == sorted({e.id for e in log})
    assert all(b.at >= a.at for a, b in itertools.pairwise(log))
    everything = reg.events()
    assert len(everything) == 7 and [e.action for e in reg.events("prompt")] == ["publish"]
    recent = reg.events(since=cutoff)  # the cutoff is the first promote's time
    assert all(e.at >= cutoff for e in recent)
    assert [e.id for e in recent][-5:] == [e.id for e in everything[2:]]


def test_diff_is_unified_over_sorted_json(reg: Registry) -> None:
    reg.publish("prompt", "p", {"sections": {"role": "shopper", "rules": ["a"]}, "v": 1})
    reg.publish("prompt", "p", {"v": 1, "sections": {"role": "shopper", "rules": ["a", "b"]}})
    diff = reg.diff("prompt", "p", 1, 2)
    lines = diff.splitlines()
    assert lines[:2] == ["--- prompt/p@v1", "+++ prompt/p@v2"]
    assert '-      "a"' in lines and '+      "a",' in lines and '+      "b"' in lines
    assert reg.diff("prompt", "p", 2, 2) == ""
    with pytest.raises(ArtifactNotFound):
        reg.diff("prompt", "p", 1, 3)


# -- errors -------------------------------------------------------------------------------------
def test_missing_versions_raise_key_error_subclass(reg: Registry) -> None:
    with pytest.raises(KeyError) as err:
        reg.get("prompt", "nope")
    assert isinstance(err.value, ArtifactNotFound) and isinstance(err.value, RunError)
    assert "nothing was published" in str(err.value) and not str(err.value).startswith("'")
    reg.publish("prompt", "p", {})
    with pytest.raises(ArtifactNotFound, match="has no version 5") as err2:
        reg.get("prompt", "p", 5)
    assert (err2.value.kind, err2.value.name, err2.value.version) == ("prompt", "p", 5)
    with pytest.raises(ConfigError, match="not both"):
        reg.get("prompt", "p", 1, label="active")


def test_errors_pickle_with_attributes() -> None:
    err = ArtifactNotFound("no label", kind="prompt", name="p", version=3, label="active")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ArtifactNotFound and str(back) == "no label"
    assert (back.kind, back.name, back.version, back.label) == ("prompt", "p", 3, "active")
    assert isinstance(back, KeyError) and isinstance(back, EvoharnessError)
    plain = pickle.loads(pickle.dumps(RegistryError("lost")))
    assert str(plain) == "lost" and isinstance(plain, RunError)
    import evoharness.sdk.registry as registry

    assert {"ArtifactNotFound", "RegistryError"} <= set(registry.__all__)
    assert all(hasattr(registry, n) for n in registry.__all__)


# -- concurrency --------------------------------------------------------------------------------
_WORKER = """
import sys, time
from pathlib import Path
from evoharness.sdk.registry import open_registry

url, tag, go, n = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
reg = open_registry(url)
Path(go.parent / f"ready-{tag}").touch()
while not go.exists():  # start together
    time.sleep(0.01)
print(" ".join(str(reg.publish("prompt", "race", {"by": tag, "i": i}).version) for i in range(n)))
reg.close()
"""


def test_concurrent_publishers_in_two_processes_get_distinct_versions(
    registry_url: str, tmp_path: Path
) -> None:
    # no registry opened yet: both workers create the schema at the same time too
    go, n = tmp_path / "go", 15
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, registry_url, tag, str(go), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    while not all((tmp_path / f"ready-{t}").exists() for t in "ab"):
        if any(p.poll() is not None for p in procs):
            break
        threading.Event().wait(0.01)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    got = [[int(x) for x in out.split()] for out, _ in outs]
    assert sorted(got[0] + got[1]) == list(range(1, 2 * n + 1))
    assert all(g == sorted(g) for g in got)  # each writer sees its numbers increase
    with open_registry(registry_url) as reg:
        versions = reg.versions("prompt", "race")
        assert len({v.content_hash for v in versions}) == 2 * n
        assert len(reg.events("prompt", "race")) == 2 * n


def test_threads_share_one_registry(reg: Registry) -> None:
    numbers: list[int] = []

    def work(tag: int) -> None:
        for i in range(10):
            numbers.append(reg.publish("memory", "t", {"t": tag, "i": i}).version)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(numbers) == list(range(1, 41))


# -- schema, URLs, runtime reads ----------------------------------------------------------------
def test_schema_version_table_and_reopen(registry_url: str) -> None:
    first = open_registry(registry_url)
    first.publish("prompt", "p", {"a": 1})
    assert first.schema_version() == 2
    first.close()
    with open_registry(registry_url) as again:
        assert again.schema_version() == 2 and again.get("prompt", "p").content == {"a": 1}


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    SQLiteRegistry(path).close()
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO registry_schema VALUES (99, 0)")
    with pytest.raises(ConfigError, match="upgrade evoharness"):
        SQLiteRegistry(path)


def test_open_registry_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_registry("sqlite:///rel.db") as rel:
        rel.publish("k", "n", 1)
    assert (tmp_path / "rel.db").exists()
    with open_registry(f"sqlite:///{tmp_path}/abs.db") as absolute:
        assert isinstance(absolute, SQLiteRegistry)
    assert (tmp_path / "abs.db").exists()
    with open_registry(tmp_path / "sub" / "p.db") as by_path:
        assert by_path.names("k") == []
    with open_registry("sqlite://") as memory:
        assert memory.publish("k", "n", {}).version == 1
    with pytest.raises(ConfigError, match="unknown registry URL scheme 'mysql'"):
        open_registry("mysql://x/y")
    with pytest.raises(RegistryError, match="cannot connect to PostgreSQL") as err:
        open_registry("postgresql://nobody:secret@127.0.0.1:1/none")
    assert "secret" not in str(err.value)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(MissingExtraError, match=r"evoharness\[postgres\]"):
        open_registry("postgresql://127.0.0.1/x")


def test_active_artifact_follows_promote_and_rollback(reg: Registry) -> None:
    parsed: list[int] = []

    def parse(v: ArtifactVersion) -> Any:
        parsed.append(v.version)
        return v.content["rules"]

    active: ActiveArtifact[list[str]] = ActiveArtifact(
        reg, "guard_rules", "shop", parse=parse, default=[], refresh_s=0
    )
    assert active() == [] and active.version is None
    for rules in (["a"], ["a", "b"]):
        reg.promote(
            "guard_rules", "shop", reg.publish("guard_rules", "shop", {"rules": rules}).version
        )
        assert active() == rules
    assert active() == ["a", "b"] and parsed == [1, 2]  # parsed once per version
    reg.rollback("guard_rules", "shop")
    assert active() == ["a"] and active.version is not None and active.version.version == 1
    slow: ActiveArtifact[list[str]] = ActiveArtifact(
        reg, "guard_rules", "shop", parse=parse, default=[], refresh_s=3600
    )
    assert slow() == ["a"]
    reg.promote("guard_rules", "shop", 2)
    assert slow() == ["a"]  # cached until refresh_s passes


class _GatedRegistry:
    """Delegates to a registry; label look-ups wait until ``gate`` is set."""

    def __init__(self, inner: Registry) -> None:
        self.inner = inner
        self.gate = threading.Event()

    def labels(self, kind: str, name: str) -> dict[str, int]:
        self.gate.wait()
        return self.inner.labels(kind, name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


def test_active_artifact_background_refresh_never_blocks_the_caller(reg: Registry) -> None:
    reg.promote("prompt", "p", reg.publish("prompt", "p", {"t": "one"}).version)
    gated = _GatedRegistry(reg)
    gated.gate.set()
    active: ActiveArtifact[Any] = ActiveArtifact(
        gated,
        "prompt",
        "p",
        parse=lambda v: v.content["t"],
        default=None,
        refresh_s=0,
        background=True,
    )
    assert active() == "one"  # the first load is synchronous
    gated.gate.clear()  # from now on a look-up hangs until released
    reg.promote("prompt", "p", reg.publish("prompt", "p", {"t": "two"}).version)
    assert active() == "one" and active() == "one"  # served at once, one worker in flight
    gated.gate.set()
    active.join()
    assert active.refresh() == "two" and active() == "two"
    active.join()


def test_active_artifact_serves_the_last_version_through_an_outage(registry_url: str) -> None:
    reg = open_registry(registry_url)
    reg.promote("prompt", "p", reg.publish("prompt", "p", {"t": "one"}).version)
    active: ActiveArtifact[Any] = ActiveArtifact(
        reg, "prompt", "p", parse=lambda v: v.content["t"], default=None, refresh_s=0
    )
    assert active() == "one"
    reg.close()  # every look-up fails from now on
    assert active() == "one" and isinstance(active.last_error, RegistryError)
    never: ActiveArtifact[Any] = ActiveArtifact(
        reg, "prompt", "p", parse=lambda v: v.content["t"], default=None, refresh_s=0
    )
    with pytest.raises(RegistryError):
        never()  # nothing was ever loaded: the caller must know


def test_postgres_connection_is_replaced_after_the_server_drops_it(postgres_db: str) -> None:
    import psycopg

    reg = open_registry(_own_schema(postgres_db))
    reg.publish("prompt", "p", {"t": 1})
    (pid,) = reg._conn.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[attr-defined]
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(RegistryError, match="PostgreSQL registry"):
        reg.get("prompt", "p")  # this call finds the connection gone
    assert reg.get("prompt", "p").content == {"t": 1}  # the next one reconnects
    reg.close()


# -- what evolve publishes: guard rules and memory snapshots, on both backends -----------------
def test_guard_rules_publish_activate_rollback_audit(reg: Registry) -> None:
    rules = GuardRuleVersions(reg, "shop", author="evolve:cycle")
    provider = active_guard_rules(reg, "shop", refresh_s=0, background=False)
    guard = OutputGuardMiddleware(rules_provider=provider)
    secret = "your key is sk-abcdefgh12 and the password is hunter2"
    assert guard.check(secret) == (secret, [], []) and guard.rules.version == 0

    key = GuardRule(name="no-key", pattern=r"sk-[a-z0-9]{8,}", replacement="[key]")
    v1 = rules.publish(GuardRuleSet(rules=(key,)), reason="leaked key in P0 cases")
    assert v1.version == 1 and guard.check(secret)[0] == secret.replace("sk-abcdefgh12", "[key]")
    password = GuardRule(name="no-password", pattern="password", action="block")
    v2 = rules.publish(v1.model_copy(update={"rules": (key, password)}))
    assert guard.check(secret) == (None, ["no-key"], ["no-password"]) and guard.rules == v2
    assert '+      "name": "no-password",' in rules.diff(1, 2).splitlines()

    back = rules.rollback(reason="blocks too much")
    assert back == v1 and guard.check(secret)[2] == [] and guard.rules.version == 1
    with pytest.raises(ArtifactNotFound):
        rules.rollback()  # v1 was the first active version
    assert rules.activate(2) == v2 and rules.versions() == [1, 2]
    assert [(e.action, e.version, e.previous, e.actor) for e in reg.events("guard_rules")] == [
        ("publish", 1, None, "evolve:cycle"),
        ("promote", 1, None, "evolve:cycle"),
        ("publish", 2, None, "evolve:cycle"),
        ("promote", 2, 1, "evolve:cycle"),
        ("rollback", 1, 2, "evolve:cycle"),
        ("promote", 2, 1, "evolve:cycle"),
    ]
    assert reg.events("guard_rules")[4].reason == "blocks too much"
    assert reg.get("guard_rules", "shop", 2).parent == 1


def test_guard_rules_reach_the_agent_through_the_harness(reg: Registry) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage

    from evoharness.harness import HarnessConfig, default_middleware
    from evoharness.sdk.testing import ScriptedChatModel

    rules = GuardRuleVersions(reg)
    rules.publish(GuardRuleSet(rules=(GuardRule(name="no-key", pattern=r"sk-[a-z0-9]{8,}"),)))
    config = HarnessConfig(
        guard_rules_provider=active_guard_rules(reg, refresh_s=0, background=False),
        breaker=None,
        drift_every=None,
    )

    def answer() -> str:
        model = ScriptedChatModel(script=["the key is sk-abcdefgh12"])
        agent: Any = create_agent(model, [], middleware=default_middleware(config))
        return str(agent.invoke({"messages": [HumanMessage("key?")]})["messages"][-1].content)

    assert answer() == "the key is [redacted]"
    rules.publish(GuardRuleSet(rules=()))  # an empty set, then roll back to the rule
    assert answer() == "the key is sk-abcdefgh12"
    rules.rollback()
    assert answer() == "the key is [redacted]"


def test_memory_snapshots_publish_restore_rollback_audit(registry_url: str, tmp_path: Path) -> None:
    from evoharness.sdk.memory import MemoryEntry, MemoryStore

    def entry(summary: str) -> MemoryEntry:
        return MemoryEntry(kind="strategy", query_pattern="kitchen", summary=summary)

    reg = open_registry(registry_url)
    store = MemoryStore(tmp_path / "live.db", registry=reg, name="shop", author="evolve:cycle")
    a, b = entry("search then summarise"), entry("compare landed prices")
    v1 = store.replace({a.id: a}, note="cycle 1")
    v2 = store.replace({a.id: a, b.id: b}, note="cycle 2")
    assert (v1, v2) == (1, 2) and store.active_version() == 2
    snapshot = reg.get("memory", "shop", label="active")
    assert [e["id"] for e in snapshot.content] == sorted([a.id, b.id])
    assert snapshot.metadata == {"note": "cycle 2"} and snapshot.author == "evolve:cycle"

    assert store.restore(v1) == 1 and list(store.entries()) == [a.id]
    assert store.rollback() == 2 and set(store.entries()) == {a.id, b.id}
    assert store.rollback() == 1 and list(store.entries()) == [a.id]
    assert len(store.versions()) == 2  # restores and rollbacks publish nothing

    # a second app instance on the same registry sees the same snapshots
    other = MemoryStore(tmp_path / "other.db", registry=reg, name="shop")
    assert [v for v, _, _ in other.versions()] == [1, 2] and other.active_version() == 1
    assert [(e.action, e.version, e.previous) for e in reg.events("memory", "shop")] == [
        ("publish", 1, None),
        ("promote", 1, None),
        ("publish", 2, None),
        ("promote", 2, 1),
        ("promote", 1, 2),
        ("rollback", 2, 1),
        ("rollback", 1, 2),
    ]
    store.close()
    other.close()
    reg.close()


# -- the command line ---------------------------------------------------------------------------
def test_registry_cli_inspects_promotes_and_rolls_back(
    registry_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from evoharness.evolve.cli import main

    with open_registry(registry_url) as reg:
        for text in ("one", "two", "three"):
            reg.promote("prompt", "sys", reg.publish("prompt", "sys", {"text": text}).version)
    at = ["--registry", registry_url]

    def run(*args: str) -> tuple[int, str]:
        code = main(["registry", *args, *at])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    code, out = run("list", "prompt")
    assert code == 0 and "sys" in out and "active=v3" in out
    code, out = run("versions", "prompt", "sys")
    assert code == 0 and all(f"v{n}" in out for n in (1, 2, 3))
    code, out = run("show", "prompt", "sys", "--label", "active")
    assert code == 0 and json.loads(out)["content"] == {"text": "three"}
    code, out = run("diff", "prompt", "sys", "1", "2")
    assert code == 0 and '-  "text": "one"' in out and '+  "text": "two"' in out
    code, out = run("rollback", "prompt", "sys", "--reason", "bad answers")
    assert code == 0 and "active: v2 (was v3)" in out
    code, out = run("promote", "prompt", "sys", "1")
    assert code == 0 and "active: v1 (was v2)" in out
    code, out = run("events", "prompt", "sys", "--json", "--last", "2")
    last_two = [json.loads(line) for line in out.splitlines()]
    assert [(e["action"], e["version"]) for e in last_two] == [("rollback", 2), ("promote", 1)]
    assert last_two[0]["reason"] == "bad answers" and last_two[0]["actor"] == "cli"
    code, out = run("promote", "prompt", "sys", "9")
    assert code == 1 and "has no version 9" in out
