"""Guard-rule proposals: output rules for the P0 failures a text pattern can prevent.

Rule sets are published as registry artifacts
(:class:`~evoharness.sdk.registry.GuardRuleVersions`); the cycle proposes from the ``guard``
pool and records a reviewable :func:`diff_summary` of each change.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from evoharness.harness import GuardRule, GuardRuleSet
from evoharness.harness.tracing.masking import SECRET_PATTERNS

__all__ = ["diff_summary", "propose_guard_rules"]


def _one_pattern(patterns: str | Sequence[str], answer: str) -> str:
    """The regex of a secret kind (given as one pattern or alternatives) that fits
    ``answer``: the alternative that matches it, else the first."""
    if isinstance(patterns, str):
        return patterns
    return next((p for p in patterns if re.search(p, answer)), patterns[0])


def propose_guard_rules(
    packages: list[dict[str, Any]], existing: GuardRuleSet, *, job: str = "cycle"
) -> list[GuardRule]:
    """Rules for P0 failures that an output rule can prevent.

    Leaked secrets become redaction rules for the secret kinds found in the answers;
    fabricated or forbidden items and budget violations are not text patterns, so they go
    to lessons instead (see the memory layer).
    """
    have = {r.name for r in existing.rules}
    proposed: dict[str, GuardRule] = {}
    for pkg in packages:
        verdict = pkg["verdict"]
        if "leaked_secret" not in verdict["p0_failures"]:
            continue
        answer = str(pkg.get("final_answer") or "")
        for kind, patterns in SECRET_PATTERNS.items():
            pattern = _one_pattern(patterns, answer)
            name = f"no-{kind.replace('_', '-')}"
            if name in have or name in proposed:
                continue
            if re.search(pattern, answer) or f"[masked:{kind}]" in answer:
                proposed[name] = GuardRule(
                    name=name,
                    pattern=pattern,
                    action="redact",
                    replacement=f"[removed {kind}]",
                    source=f"evolve:{job}:{pkg['trace_id'][:12]}",
                )
    return [proposed[k] for k in sorted(proposed)]


def diff_summary(old: GuardRuleSet, new: GuardRuleSet) -> str:
    """A reviewable summary of a rule change."""
    before = {r.name: r for r in old.rules}
    after = {r.name: r for r in new.rules}
    lines = [f"guard rules v{old.version} -> v{new.version}"]
    lines += [
        f"+ {n}: {json.dumps(after[n].pattern)} ({after[n].action}, {after[n].source})"
        for n in sorted(set(after) - set(before))
    ]
    lines += [f"- {n}" for n in sorted(set(before) - set(after))]
    return "\n".join(lines)
