"""Strict option types in every harness config: ``"10"``, ``True`` and ``1000.0`` are not 10,
and a wrong type is a ConfigError naming the field (as LangChain's own middleware rejects it)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from evoharness.harness import (
    BreakerConfig,
    ConfigError,
    DriftCheckMiddleware,
    HarnessConfig,
    LoopDetectionMiddleware,
    ReplyCheckConfig,
    TokenBudgetMiddleware,
    ToolGuardMiddleware,
    default_middleware,
)
from evoharness.harness.context import ContextConfig, ProjectionRule
from evoharness.harness.governance.tool_guard import PhasePolicy

PHASES = {"initial": "a", "phases": {"a": ["t"]}}

BAD: list[tuple[Callable[..., Any], dict[str, Any], str]] = [
    # (the config or middleware, its valid keyword arguments, the option to spoil)
    (ContextConfig, {}, "rounds_trigger"),
    (ContextConfig, {}, "tail_trigger_tokens"),
    (ContextConfig, {}, "total_trigger_tokens"),
    (ContextConfig, {}, "keep_exchanges"),
    (ContextConfig, {}, "offload_chars"),
    (ContextConfig, {}, "preview_chars"),
    (ContextConfig, {}, "judge_above_chars"),
    (ContextConfig, {}, "judged_top_n"),
    (ProjectionRule, {"tool": "search"}, "top_n"),
    (HarnessConfig, {}, "max_result_chars"),
    (HarnessConfig, {}, "loop_same_call"),
    (HarnessConfig, {}, "loop_same_tool"),
    (HarnessConfig, {}, "loop_escalate_after"),
    (HarnessConfig, {}, "budget_tokens"),
    (HarnessConfig, {}, "drift_every"),
    (BreakerConfig, {}, "window_size"),
    (BreakerConfig, {}, "minimum_calls"),
    (BreakerConfig, {}, "half_open_max_calls"),
    (BreakerConfig, {}, "max_keys"),
    (ReplyCheckConfig, {}, "max_retries"),
    (LoopDetectionMiddleware, {}, "same_call"),
    (LoopDetectionMiddleware, {}, "same_tool"),
    (LoopDetectionMiddleware, {}, "escalate_after"),
    (TokenBudgetMiddleware, {"budget_tokens": 1000}, "budget_tokens"),
    (DriftCheckMiddleware, {}, "every"),
    (DriftCheckMiddleware, {}, "window"),
    (DriftCheckMiddleware, {}, "severe_limit"),
    (ToolGuardMiddleware, {}, "max_result_chars"),
]
NOT_AN_INT = ["10", True, 1000.0, b"10"]


@pytest.mark.parametrize("value", NOT_AN_INT, ids=repr)
@pytest.mark.parametrize(
    ("make", "valid", "option"), BAD, ids=[f"{m.__name__}.{o}" for m, _, o in BAD]
)
def test_an_int_option_refuses_what_is_not_an_int(
    make: Callable[..., Any], valid: dict[str, Any], option: str, value: object
) -> None:
    with pytest.raises(ConfigError) as info:
        make(**{**valid, option: value})
    assert info.value.field == option
    assert option in str(info.value) and repr(value) in str(info.value)
    assert "'10', True or 10.0" in str(info.value)  # how to fix it
    assert pickle.loads(pickle.dumps(info.value)).field == option


FLOATS: list[tuple[Callable[..., Any], dict[str, Any], str, float]] = [
    (BreakerConfig, {}, "failure_rate_threshold", 0.5),
    (BreakerConfig, {}, "open_duration_s", 30.0),
    (BreakerConfig, {}, "slow_call_threshold_s", 2.0),
    (TokenBudgetMiddleware, {"budget_tokens": 1000}, "tight_at", 0.5),
    (DriftCheckMiddleware, {}, "min_overlap", 0.5),
]


@pytest.mark.parametrize(
    ("make", "valid", "option", "good"), FLOATS, ids=[f"{m.__name__}.{o}" for m, _, o, _ in FLOATS]
)
def test_a_float_option_refuses_text_and_booleans(
    make: Callable[..., Any], valid: dict[str, Any], option: str, good: float
) -> None:
    make(**{**valid, option: good})
    for bad in (str(good), True):
        with pytest.raises(ConfigError) as info:
            make(**{**valid, option: bad})
        assert info.value.field == option


@pytest.mark.parametrize(
    ("make", "kwargs", "field"),
    [
        (ContextConfig, {"hot_note": "yes"}, "hot_note"),
        (ContextConfig, {"projections": [{"tool": "s", "top_n": "3"}]}, "projections"),
        (ProjectionRule, {"tool": "s", "fields": "item_id"}, "fields"),
        (ProjectionRule, {"tool": "s", "format": "csv"}, "format"),
        (ReplyCheckConfig, {"nudge": 1}, "nudge"),
        (HarnessConfig, {"terminal_tool": 3}, "terminal_tool"),
        (HarnessConfig, {"context": {"rounds_trigger": "10"}}, "context"),
        (HarnessConfig, {"breaker": {"window_size": 20.0}}, "breaker"),
        (HarnessConfig, {"loop_poll_tools": [1]}, "loop_poll_tools"),
        (PhasePolicy, {"initial": 1, "phases": {"a": ["t"]}}, "initial"),
        (PhasePolicy, {"initial": "a", "phases": {"a": "t"}}, "phases"),
    ],
)
def test_other_wrong_types_are_config_errors_naming_the_field(
    make: Callable[..., Any], kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        make(**kwargs)
    assert info.value.field == field and field in str(info.value)


def test_valid_values_keep_working(tmp_path: Path) -> None:
    config = HarnessConfig(
        breaker={"window_size": 20, "minimum_calls": 5, "open_duration_s": 30},
        context={"rounds_trigger": 10, "projections": [{"tool": "s", "top_n": 3}]},
        loop_poll_tools={"status"},  # any collection of names
        guard_rules_path=str(tmp_path / "rules.json"),  # a string is a path
        cold_dir=str(tmp_path / "cold"),
        phases=PhasePolicy(**PHASES),
        budget_tokens=10_000,
    )
    assert config.breaker == BreakerConfig(window_size=20, minimum_calls=5, open_duration_s=30)
    assert config.context is not None and config.context.projections[0].top_n == 3
    assert config.loop_poll_tools == frozenset({"status"})
    assert config.cold_dir == tmp_path / "cold"
    assert default_middleware(config)  # builds
    assert BreakerConfig(open_duration_s=30).open_duration_s == 30.0  # an int is a float
    # ranges and the cross-field rule still say what to fix
    with pytest.raises(ConfigError, match="Fix the value") as info:
        BreakerConfig(minimum_calls=50, window_size=20)
    assert "minimum_calls (50) is larger than window_size" in str(info.value)
    with pytest.raises(ConfigError, match="unknown_option"):
        ContextConfig(unknown_option=1)
