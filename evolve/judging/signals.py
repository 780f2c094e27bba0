"""Generic signals: rule checks that need no checker and no model.

They judge what any tool-using agent's trace shows: a run that did nothing, a refusal, an
answer claiming actions no tool call performed, a run that ended on an error, calls that keep
failing, and the harness's interventions (loop stops, budget exhaustion, guard blocks,
rejected or malformed calls, open circuits, truncations). They can show that a run failed;
they never show that it succeeded (see ``RubricItem.outcome``).
"""

from __future__ import annotations

import re
from collections import Counter

from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.rubric import ItemResult, Rubric

_REFUSAL = re.compile(
    r"\b(?:i\s*(?:can(?:no|')t|cannot|am\s+unable\s+to|'m\s+unable\s+to|am\s+not\s+able\s+to"
    r"|won't|will\s+not)\s+(?:help|assist|do|complete|provide|fulfil|fulfill|process|handle"
    r"|perform|answer)"
    r"|as\s+an\s+ai\b|i\s+(?:must|have\s+to)\s+decline)",
    re.IGNORECASE,
)
_ACTION = (
    r"booked|ordered|purchased|bought|sent|emailed|scheduled|cancell?ed|refunded|transferred"
    r"|paid|created|updated|deleted|searched|checked|calculated|compared|looked\s+up|added"
    r"|removed|submitted|placed|reserved|filed|saved|confirmed|verified|picked|selected"
)
_CLAIM = re.compile(
    rf"\bI(?:'ve|\s+have)?\s+(?:just\s+|now\s+|already\s+|successfully\s+)?(?:{_ACTION})\b"
    rf"|\b(?:has|have)\s+been\s+(?:successfully\s+)?(?:{_ACTION})\b",
    re.IGNORECASE,
)
_INTERVENTION_ITEMS = (
    "loop_stopped",
    "budget_exhausted",
    "guard_blocked",
    "tool_rejected",
    "malformed_tool_call",
    "circuit_open",
    "truncated",
)


def is_refusal(text: str) -> bool:
    """Whether ``text`` declines the task ("I cannot help with that")."""
    return bool(_REFUSAL.search(text))


def claims_action(text: str) -> bool:
    """Whether ``text`` says an action was carried out ("I have booked ...")."""
    return bool(_CLAIM.search(text))


class SignalChecks:
    """The generic signals as a rule check (``RuleJudge`` calls it like a function).

    Args:
        needs_tools: Whether a task needs tool calls. ``None`` (default): needed whenever
            the model was offered tools, or when the trace does not say.
        repeated_failures_at: Failed calls with identical arguments that count as repeating.
    """

    def __init__(self, *, needs_tools: bool | None = None, repeated_failures_at: int = 3) -> None:
        self.needs_tools = needs_tools
        self.repeated_failures_at = repeated_failures_at

    def __call__(self, e: Episode, rubric: Rubric) -> list[ItemResult]:
        answer = str(e.final_answer or "")
        ok_calls = [c for c in e.tool_calls if not c.error]
        needed = (
            self.needs_tools
            if self.needs_tools is not None
            else e.evidence.tools_available is None or e.evidence.tools_available > 0
        )
        nothing = needed and not e.tool_calls
        refused = is_refusal(answer)
        claim = claims_action(answer) and not ok_calls
        ended_error = e.evidence.last_observation_error or bool(
            e.tool_calls and e.tool_calls[-1].error
        )
        failing = Counter((c.name, repr(sorted(c.args.items()))) for c in e.tool_calls if c.error)
        repeated = sorted({n for (n, _), k in failing.items() if k >= self.repeated_failures_at})
        out = [
            _item("did_nothing", not nothing, "no tool call although tools were needed"),
            _item("refused", not refused, "the answer declines the task"),
            _item("unsupported_claim", not claim, "claims actions but no tool call succeeded"),
            _item("ended_on_error", not ended_error, "the last tool call failed"),
            _item(
                "repeated_failures",
                not repeated,
                f"kept failing: {', '.join(repeated)}" if repeated else "",
            ),
        ]
        kinds = e.evidence.kinds()
        for item_id in _INTERVENTION_ITEMS:
            n = e.evidence.count(item_id)
            out.append(_item(item_id, item_id not in kinds, f"{n} intervention(s)"))
        return [r for r in out if rubric.item(r.id) is not None]


def _item(item_id: str, passed: bool, why: str) -> ItemResult:
    return ItemResult(id=item_id, priority="P1", passed=passed, comment="" if passed else why)


check_signals = SignalChecks()
"""The generic signals with default settings."""
