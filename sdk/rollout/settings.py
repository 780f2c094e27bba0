"""Rollout settings written as text (``--stages 0.1,0.3,1.0``, ``--tolerance tokens=25%``),
parsed and checked once for every command that starts a rollout."""

from __future__ import annotations

from collections.abc import Iterable

from evoharness.harness.errors import ConfigError
from evoharness.sdk.rollout.decision import DecisionEngine
from evoharness.sdk.rollout.experiment import check_stages

__all__ = ["parse_stages", "parse_tolerances"]


def _number(text: str) -> float:
    """``0.25`` or ``25%`` -> 0.25 (raises ``ValueError``)."""
    text = text.strip()
    return float(text[:-1]) / 100 if text.endswith("%") else float(text)


def parse_stages(text: str) -> list[float]:
    """``"0.1,0.3,1.0"`` (or ``"10%,30%,100%"``) -> ``[0.1, 0.3, 1.0]``.

    Raises:
        ConfigError: Not a list of numbers, or not stages a rollout can run (at least one
            partial stage, strictly increasing, ending at 1.0).
    """
    try:
        stages = [_number(s) for s in text.split(",") if s.strip()]
        return check_stages(stages)
    except ValueError as exc:
        raise ConfigError(
            f"--stages {text!r}: {exc} (write the traffic per stage, e.g. 0.1,0.3,1.0)"
            if "stages must" in str(exc)
            else f"--stages {text!r} is not a list of numbers such as 0.1,0.3,1.0",
            field="stages",
        ) from exc


def parse_tolerances(
    items: Iterable[str], *, engine: DecisionEngine | None = None
) -> dict[str, float]:
    """``["tokens=25%", "latency_s=0.5"]`` -> ``{"tokens": 0.25, "latency_s": 0.5}``.

    Each is ``METRIC=VALUE`` in the metric's own terms (``tokens`` and ``latency_s``: a
    fraction of the control mean; rates: absolute), checked against ``engine``'s metrics
    (default: :class:`DecisionEngine`'s) so that a typo fails before any work is done.

    Raises:
        ConfigError: Not ``METRIC=VALUE``, an unknown metric, or a negative value.
    """
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError(item)
            out[name.strip()] = _number(value)
        except ValueError as exc:
            raise ConfigError(
                f"--tolerance {item!r}: write METRIC=VALUE, e.g. tokens=0.10 or tokens=10% "
                "(a winner may cost 10% more tokens)",
                field="tolerance",
            ) from exc
    return (engine or DecisionEngine()).check_tolerances(out)
