"""Deterministic, sticky assignment of users (or sessions) to rollout arms.

A unit's bucket is a pure function of the experiment salt and the unit id (SHA-256, the first
64 bits as a fraction of 2**64), so every process and every app instance agrees without
coordination. Two independent buckets are drawn per unit: the *exposure* bucket decides
whether the unit is in the rolled-out traffic (``bucket < traffic``, so raising the traffic
from 10% to 30% keeps everyone who was exposed exposed), and the *arm* bucket picks a
candidate arm by weight (independent of the traffic, so a unit's arm never changes between
stages).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from evoharness.harness.errors import ConfigError


def bucket(salt: str, unit: str) -> float:
    """A uniform number in ``[0, 1)`` fixed by ``salt`` and ``unit``.

    Example:
        >>> bucket("exp-1", "user-42") == bucket("exp-1", "user-42")
        True
        >>> 0.0 <= bucket("exp-1", "user-42") < 1.0
        True
    """
    digest = hashlib.sha256(f"{salt}\x1f{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def pick(weights: Sequence[float], u: float) -> int:
    """The index whose share of ``sum(weights)`` contains ``u`` (``u`` in ``[0, 1)``).

    Raises:
        ConfigError: No weights, or a weight that is not positive.
    """
    if not weights or any(w <= 0 for w in weights):
        raise ConfigError(
            f"arm weights must be positive and non-empty, got {list(weights)}", field="weights"
        )
    total = float(sum(weights))
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w / total
        if u < acc:
            return i
    return len(weights) - 1


def assign(salt: str, unit: str, traffic: float, weights: Sequence[float]) -> int | None:
    """The candidate arm index for ``unit``, or ``None`` when it stays on the control.

    Args:
        salt: The experiment's salt (a new salt reshuffles everyone).
        unit: The user id (or session id when there is no user).
        traffic: The fraction of units exposed to candidates at this stage.
        weights: The candidate arms' relative weights.
    """
    if bucket(salt + ":exposure", unit) >= traffic:
        return None
    return pick(weights, bucket(salt + ":arm", unit))
