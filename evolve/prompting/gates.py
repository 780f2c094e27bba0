"""Gates a prompt candidate passes before any evaluation, let alone a user, sees it.

- **Size cap**: the diff (changed characters over all sections) stays under a limit.
- **Protected sections** (tool descriptions, safety constraints) are never removed,
  rewritten, moved or un-protected.
- **Append, don't rewrite**: the active version's rendered static prefix must stay a prefix
  of the candidate's (so the provider's prompt cache keeps hitting), unless allowed.
- **Quota**: at most ``max_per_period`` candidates per prompt per period, counted from the
  ``prompt_proposal`` records in the registry.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from evoharness.sdk.prompts import PromptDiff, PromptTemplate, diff_templates
from evoharness.sdk.registry import Registry

__all__ = ["PROPOSAL_KIND", "GateConfig", "GateReport", "check_gates", "proposals_in_period"]

PROPOSAL_KIND = "prompt_proposal"
"""Registry kind of the proposal records (one version per candidate, accepted or not)."""


class GateConfig(BaseModel):
    """Gate settings.

    Attributes:
        max_diff_chars: Most characters added plus removed over all sections.
        allow_prefix_rewrite: Accept a candidate that changes the active static prefix.
        max_per_period: Most candidates per prompt per period (recorded in the registry).
        period_s: The period, in seconds (default one day).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_diff_chars: int = Field(800, ge=1)
    allow_prefix_rewrite: bool = False
    max_per_period: int = Field(3, ge=1)
    period_s: float = Field(86_400.0, gt=0)


class GateReport(BaseModel):
    """The gates' verdict on one candidate."""

    passed: bool
    reasons: list[str] = Field(default_factory=list)
    diff_chars: int = 0
    prefix_preserved: bool = True
    diff: str = ""


def diff_size(d: PromptDiff) -> int:
    """Characters added plus removed over all sections (from the unified diffs)."""
    n = 0
    for s in d.changed:
        for line in s.text_diff:
            if line.startswith(("+++", "---", "@@")):
                continue
            if line.startswith(("+", "-")):
                n += len(line) - 1
    return n


def proposals_in_period(
    registry: Registry, prompt: str, *, period_s: float, now: float | None = None
) -> int:
    """How many candidates of ``prompt`` passed the gates (and so were published and
    evaluated) in the last ``period_s`` seconds, from the ``prompt_proposal`` records."""
    now = time.time() if now is None else now
    return sum(
        1
        for v in registry.versions(PROPOSAL_KIND, prompt)
        if v.created_at >= now - period_s and v.metadata.get("counted", True)
    )


def check_gates(
    active: PromptTemplate,
    candidate: PromptTemplate,
    config: GateConfig | None = None,
    *,
    registry: Registry | None = None,
    prompt: str | None = None,
    now: float | None = None,
) -> GateReport:
    """Check ``candidate`` against the ``active`` version; all failed gates are listed.

    With ``registry`` and ``prompt``, the per-period quota is checked too.
    """
    c = config or GateConfig()
    d = diff_templates(active, candidate)
    reasons: list[str] = []
    if d.empty:
        reasons.append("empty: the candidate equals the active version")
    size = diff_size(d)
    if size > c.max_diff_chars:
        reasons.append(f"diff too large: {size} characters changed > cap {c.max_diff_chars}")
    protected = [s for s in active.sections if s.protected]
    for s in protected:
        now_s = candidate.section(s.name)
        if now_s is None:
            reasons.append(f"protected section {s.name!r} removed")
        elif now_s.text != s.text or not now_s.protected or now_s.kind != s.kind:
            reasons.append(f"protected section {s.name!r} rewritten")
    for name in d.protected_changed:
        if candidate.section(name) is not None and all(name != s.name for s in protected):
            reasons.append(f"protected section {name!r} added or changed by a proposal")
    try:
        before, after = active.static_prefix(), candidate.static_prefix()
        preserved = after.startswith(before)
    except Exception:  # a required variable: compare the raw sections instead
        statics = [s for s in active.sections if not s.is_dynamic]
        preserved = candidate.sections[: len(statics)] == statics
    if not preserved and not c.allow_prefix_rewrite:
        reasons.append(
            "rewrites the stable prefix: append rules after it instead (keeps the provider's "
            "prompt cache), or set allow_prefix_rewrite"
        )
    if registry is not None and prompt is not None:
        used = proposals_in_period(registry, prompt, period_s=c.period_s, now=now)
        if used >= c.max_per_period:
            reasons.append(
                f"quota: {used} candidates of {prompt!r} in the last {c.period_s:g} s "
                f"(max {c.max_per_period})"
            )
    return GateReport(
        passed=not reasons,
        reasons=reasons,
        diff_chars=size,
        prefix_preserved=preserved,
        diff=str(d),
    )
