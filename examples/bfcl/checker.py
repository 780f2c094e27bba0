"""BFCL's grade of a run: its AST checker over the calls the model made.

The calls of a run (tool names mapped back to BFCL's function names) become BFCL's model
output, ``[{function: {param: value}}, ...]``, graded by BFCL's own ``ast_checker`` against
the task's possible answers with the task's category; the verdict is BFCL's ``valid``.
On top of BFCL's error types the grade names what the run did in rubric terms
(:data:`FAILURES`): ``no_call`` (the model answered in text), ``unknown_function`` (a call
of a function that is not offered: the P0 red line), and BFCL's error mapped to one
of ``wrong_function``, ``wrong_count``, ``missing_param``, ``unexpected_param``,
``wrong_type``, ``wrong_value``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel, Field

from evoharness.examples.bfcl import bfcl
from evoharness.examples.bfcl.tasks import BfclTask
from evoharness.examples.bfcl.tools import original_names

CHECKER_MODEL = "gorilla-openfunctions-v2"
"""The model name handed to BFCL's checker: one whose config keeps dots in function names
(the only thing the AST checker reads from it; the plugin maps names back itself)."""

FAILURES: tuple[str, ...] = (
    "no_call",
    "unknown_function",
    "wrong_function",
    "wrong_count",
    "missing_param",
    "unexpected_param",
    "wrong_type",
    "wrong_value",
)
"""Every failure a grade can name (the rubric items of the plugin)."""

_BY_ERROR = (
    ("wrong_func_name", "wrong_function"),
    ("wrong_count", "wrong_count"),
    ("missing_required", "missing_param"),
    ("missing_optional", "missing_param"),
    ("unexpected_param", "unexpected_param"),
    ("type_error", "wrong_type"),
    ("value_error", "wrong_value"),
    ("cannot_find_match", "wrong_value"),
)

Call = tuple[str, dict[str, Any]]


class Grade(BaseModel):
    """BFCL's verdict on one run.

    Attributes:
        valid: BFCL's verdict (the run solved the task).
        failures: What went wrong, as :data:`FAILURES` ids (empty when valid).
        error_type: BFCL's own error type (``simple_function_checker:missing_required``...).
        errors: BFCL's error messages.
        calls: The calls graded, with BFCL's function names.
    """

    valid: bool
    failures: list[str] = Field(default_factory=list)
    error_type: str | None = None
    errors: list[str] = Field(default_factory=list)
    calls: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def p0_pass(self) -> bool:
        """No call of a function that is not offered."""
        return "unknown_function" not in self.failures


def failure_of(error_type: str | None, sub_error_type: str | None = None) -> str:
    """BFCL's error type as one of :data:`FAILURES` (``wrong_value`` when unclear)."""
    for text in (sub_error_type, error_type):
        for needle, failure in _BY_ERROR:
            if text and needle in text:
                return failure
    return "wrong_value"


def grade_calls(task: BfclTask, calls: Sequence[Call]) -> Grade:
    """Grade ``calls`` (tool names as the model used them) with BFCL's AST checker."""
    names = original_names(task.functions)
    offered = set(names.values())
    output = [{names.get(name, name): dict(args)} for name, args in calls]
    if not output:
        return Grade(valid=False, failures=["no_call"], error_type="no_call")
    unknown = [next(iter(c)) for c in output if next(iter(c)) not in offered]
    result = bfcl.ast_checker()(
        list(task.functions),
        output,
        list(task.ground_truth),
        bfcl.python_language(),
        task.category,
        CHECKER_MODEL,
    )
    if result.get("valid") and not unknown:
        return Grade(valid=True, calls=output)
    failures = ["unknown_function"] if unknown else []
    error_type = result.get("error_type")
    if not result.get("valid"):
        sub = next(
            (e.get("sub_error_type") for e in result.get("error", []) if isinstance(e, dict)),
            None,
        )
        failures.append(failure_of(error_type, sub))
    return Grade(
        valid=False,
        failures=sorted(set(failures)),
        error_type=error_type or "unknown_function",
        errors=[str(e) for e in result.get("error", [])][:3],
        calls=output,
    )


def calls_of(messages: Sequence[BaseMessage]) -> list[Call]:
    """Every tool call the model made in a run, in order."""
    return [
        (c["name"], dict(c["args"]))
        for m in messages
        if isinstance(m, AIMessage)
        for c in m.tool_calls
    ]
