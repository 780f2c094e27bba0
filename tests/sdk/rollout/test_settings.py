"""Rollout settings from the command line: ``--stages``, ``--min-dwell-s``, ``--tolerance``."""

from __future__ import annotations

from pathlib import Path

import pytest

from evoharness.evolve.cli import main
from evoharness.harness import ConfigError
from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.rollout import RolloutController, parse_stages, parse_tolerances


def test_parse_stages() -> None:
    assert parse_stages("0.1,0.3,1.0") == [0.1, 0.3, 1.0]
    assert parse_stages("10%, 50%, 100%") == [0.1, 0.5, 1.0]
    with pytest.raises(ConfigError, match="not a list of numbers") as info:
        parse_stages("a,b")
    assert info.value.field == "stages"
    with pytest.raises(ConfigError, match=r"end at 1\.0"):
        parse_stages("0.1,0.5")
    with pytest.raises(ConfigError, match="increase strictly"):
        parse_stages("0.5,0.2,1")


def test_parse_tolerances() -> None:
    assert parse_tolerances(["tokens=25%", " latency_s = 0.5 "]) == {
        "tokens": 0.25,
        "latency_s": 0.5,
    }
    assert parse_tolerances([]) == {}
    for bad in ("tokens", "=0.1", "tokens=lots"):
        with pytest.raises(ConfigError, match="write METRIC=VALUE") as info:
            parse_tolerances([bad])
        assert info.value.field == "tolerance"
    with pytest.raises(ConfigError, match="no metric 'cost'"):
        parse_tolerances(["cost=0.1"])
    with pytest.raises(ConfigError, match="at least 0"):
        parse_tolerances(["tokens=-5%"])


@pytest.fixture
def registry(tmp_path: Path) -> str:
    path = tmp_path / "registry.db"
    with open_registry(path) as reg:
        store = RegistryPromptStore(reg)
        store.promote("shop", store.create("shop", PromptTemplate.from_text("v1")).version)
        store.create("shop", PromptTemplate.from_text("v2"))
    return str(path)


def test_prompts_rollout_takes_stages_dwell_and_tolerances(
    registry: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["prompts", "rollout", "shop", "2", "--registry", registry]
    options = ["--stages", "20%,1.0", "--min-dwell-s", "90", "--tolerance", "tokens=25%"]
    assert main([*args, *options, "--tolerance", "latency_s=1"]) == 0
    out = capsys.readouterr().out
    assert "stages 20%, 100%, dwell 90 s, tolerances tokens 0.25, latency_s 1" in out
    with open_registry(registry) as reg:
        exp = RolloutController(reg).running("shop")
        assert exp is not None
        assert (exp.stages, exp.min_dwell_s) == ([0.2, 1.0], 90)
        assert exp.tolerances == {"tokens": 0.25, "latency_s": 1.0}
    assert main(["prompts", "status", "shop", "--registry", registry]) == 0
    assert "dwell 90 s, tolerances {'latency_s': 1.0, 'tokens': 0.25}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--tolerance", "tokenz=0.1"], "no metric 'tokenz' to set a tolerance for"),
        (["--tolerance", "tokens"], "--tolerance 'tokens': write METRIC=VALUE"),
        (["--stages", "0.5,0.2,1"], "stages must increase strictly"),
        (["--min-dwell-s", "-1"], "--min-dwell-s"),
    ],
)
def test_prompts_rollout_refuses_bad_settings_in_one_line(
    registry: str, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    assert main(["prompts", "rollout", "shop", "2", "--registry", registry, *options]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    with open_registry(registry) as reg:
        assert RolloutController(reg).running("shop") is None
