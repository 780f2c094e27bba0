"""What a registry-backed source resolves for a session: its rollout arm, else its label.

The memory, guard-rule and adapter sources resolve the same way and differ only in what
they serve for the version they get; :func:`resolve_assigned` is that shared part.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from evoharness.sdk.registry.base import Registry
from evoharness.sdk.rollout.controller import RolloutController, assignment_for
from evoharness.sdk.session.door import Resolved, SessionContext


class AssignedSource(Protocol):
    """A source that serves the version of ``kind/name`` a rollout or a label assigns."""

    @property
    def kind(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def rollout(self) -> RolloutController | None: ...


def resolve_assigned(
    source: AssignedSource, context: SessionContext, serve: Callable[[int], Mapping[str, Any]]
) -> Resolved:
    """The session's arm of ``source``'s running rollout (sticky by user), else the version
    ``source.label`` points at (nothing before the first one is published).

    Args:
        serve: The version's :class:`Resolved` fields besides kind, name, version and the
            arm (``value``, and ``fallback`` or ``detail`` where the source has them).
    """
    got = assignment_for(
        source.rollout, source.registry, source.kind, source.name, context.unit, label=source.label
    )
    resolved = Resolved(source.kind, source.name, arm=got.arm, experiment_id=got.experiment_id)
    if got.version is None:
        return resolved
    return dataclasses.replace(resolved, version=str(got.version), **serve(got.version))
