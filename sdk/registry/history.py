"""When each version of an artifact went live: one reading of the audit log for everyone.

The monitor asked "when did this adapter version become active" and the layer router
"when did each memory snapshot go live", each with its own filter over the events. Both
are answers to one question, the list of times a label moved onto a version, so both
should come from :func:`activations`.
"""

from __future__ import annotations

from typing import NamedTuple

from evoharness.sdk.registry.base import Registry


class Activation(NamedTuple):
    """A label moved onto ``version`` at ``at`` (a promote, a set_label or a rollback)."""

    version: int
    at: float
    action: str


def activations(
    registry: Registry, kind: str, name: str, *, label: str = "active"
) -> list[Activation]:
    """Every move of ``label`` onto a version of ``kind/name``, oldest first (unlabelling
    is not a move onto a version)."""
    return [
        Activation(e.version, e.at, e.action)
        for e in registry.events(kind, name)
        if e.label == label and e.version is not None and e.action != "unlabel"
    ]


def live_since(
    registry: Registry, kind: str, name: str, *, label: str = "active", first: bool = True
) -> dict[int, float]:
    """Version -> when ``label`` first (``first``) or last moved onto it; versions it never
    served are absent."""
    out: dict[int, float] = {}
    for a in activations(registry, kind, name, label=label):
        if not first or a.version not in out:
            out[a.version] = a.at
    return out
