"""Workflow skills: a procedure over the app's own tools, run as one tool with typed parameters.

A :class:`Workflow` is data (stored as ``workflow.json`` in its skill's folder), not code:
a list of steps, each one tool with every argument taken from a parameter, a constant, or a
field of an earlier step's result; a step may run once for each value of a list. Running
it (:meth:`Workflow.plan`) is plain Python over that data — no model, no generated code, no
branching on what the tools said beyond "it failed". It may not invent an argument, call a
tool its steps do not name, or go on past a failing step (except a step learned to skip a
failing value, e.g. one search platform of several): it stops, and hands back what it did.

Each tool call it asks for goes through the harness (see
:class:`~evoharness.harness.context.skills.SkillsMiddleware`): governance, breakers and
tracing apply to every inner call exactly as to a call the model made.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evoharness.harness.context.skills import StepCall, StepResult, WorkflowOutcome, WorkflowPlan

__all__ = [
    "WORKFLOW_FILE",
    "WORKFLOW_PREFIX",
    "ArgSource",
    "Param",
    "Workflow",
    "WorkflowStep",
    "select",
    "workflow_tool_name",
]

WORKFLOW_FILE = "workflow.json"
"""Where a skill folder keeps its compiled workflow."""
WORKFLOW_PREFIX = "wf_"
"""Workflow tool names start with this (evolve ignores such calls when it reads traces)."""

JsonType = Literal["string", "number", "integer", "boolean", "array", "object"]
_SEGMENT = re.compile(r"^([A-Za-z0-9_\-]+)(\[\*\])?$")


def workflow_tool_name(skill: str) -> str:
    """The tool name of ``skill``'s workflow (``wf_`` + its name, underscores for hyphens)."""
    return (WORKFLOW_PREFIX + skill.replace("-", "_"))[:64]


class Param(BaseModel):
    """One typed parameter the model passes when it calls the workflow."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    type: JsonType
    items: JsonType | None = None
    """The element type of an ``array``."""
    required: bool = True
    default: Any = None
    description: str = ""


class ArgSource(BaseModel):
    """Where one argument of a step comes from.

    ``param``: the workflow parameter ``param``. ``const``: ``value``. ``result``: the
    values of ``field`` in the rows at ``rows`` (a path like ``results[*]``; ``""`` is the
    result itself) of step ``step``'s successful results, optionally only rows whose
    ``where`` fields equal the producing call's arguments; ``pick`` says which: ``first``,
    ``all`` (in order, unique), ``sorted`` (sorted, unique) or ``each`` (the step runs
    once per value).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["param", "const", "result"]
    param: str | None = None
    value: Any = None
    step: int | None = None
    """1-based index of the earlier step (``result``)."""
    rows: str = ""
    field: str | None = None
    where: dict[str, str] = Field(default_factory=dict)
    """Row field -> argument of the call that produced the row (``result``)."""
    pick: Literal["first", "all", "sorted", "each"] = "first"

    def describe(self) -> str:
        """The source in words (used in skill bodies)."""
        if self.kind == "param":
            return f"the parameter `{self.param}`"
        if self.kind == "const":
            return f"always `{json.dumps(self.value)}`"
        path = f"{self.rows}.{self.field}" if self.rows else str(self.field)
        filt = "".join(f" whose `{f}` equals that call's `{a}`" for f, a in self.where.items())
        which = {
            "first": "the first",
            "all": "every",
            "sorted": "every (sorted)",
            "each": "each",
        }[self.pick]
        return f"{which} `{path}`{filt} in the result of step {self.step}"


class WorkflowStep(BaseModel):
    """One step: a tool, its arguments' sources, and whether it fans out.

    Attributes:
        tool: The tool it calls.
        args: Argument name -> source.
        each: The argument whose source yields a list: the step calls the tool once per
            value (``None``: one call).
        on_error: ``stop`` (a failed call ends the workflow) or ``skip`` (a failed value of
            a fan-out is left out; the step fails only when every value failed).
        retries: How often a failed call is repeated as it was before it counts as failed
            (learned where runs recovered that way, e.g. from a timeout).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str
    args: dict[str, ArgSource]
    each: str | None = None
    on_error: Literal["stop", "skip"] = "stop"
    retries: int = Field(0, ge=0, le=3)


class Workflow(BaseModel):
    """A compiled workflow skill (see the module docstring for what it may do).

    Attributes:
        name: The tool name the model calls.
        skill: The skill it belongs to.
        description: The tool's description.
        params: Its typed parameters.
        steps: The procedure.
        returns: Steps (1-based) whose results the model gets back when it completes (the
            others are summarised; none listed: every result). A stopped workflow returns
            these and the results the steps from the failed one on read (the model goes on
            from there by hand).
        next: What the model does after it completes.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    skill: str
    description: str
    params: list[Param] = Field(default_factory=list)
    steps: list[WorkflowStep]
    returns: list[int] = Field(default_factory=list)
    next: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_\-]{1,64}", v):
            raise ValueError(f"workflow tool name {v!r}: 1-64 letters, digits, '_' or '-'")
        return v

    # -- the tool the model sees -----------------------------------------------------------
    def tool_schema(self) -> dict[str, Any]:
        """The OpenAI function schema (typed parameters, defaults)."""
        props: dict[str, Any] = {}
        for p in self.params:
            spec: dict[str, Any] = {"type": p.type}
            if p.items is not None:
                spec["items"] = {"type": p.items}
            if p.description:
                spec["description"] = p.description
            if not p.required:
                spec["default"] = p.default
            props[p.name] = spec
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": props,
                    "required": [p.name for p in self.params if p.required],
                },
            },
        }

    def to_json(self) -> str:
        """``workflow.json``'s text."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    # -- running it ------------------------------------------------------------------------
    def bind(self, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The parameter values for ``args`` (defaults filled in) and what is wrong."""
        known = {p.name: p for p in self.params}
        problems = [f"unknown parameter {k!r}" for k in args if k not in known]
        values: dict[str, Any] = {}
        for p in self.params:
            if p.name in args:
                v = args[p.name]
                if p.type == "array" and not isinstance(v, list):
                    v = [v]  # one value where a list is expected: a list of one
                values[p.name] = v
            elif p.required:
                problems.append(f"missing parameter {p.name!r} ({p.type})")
            else:
                values[p.name] = p.default
        return values, problems

    def plan(self, args: Mapping[str, Any]) -> WorkflowPlan:
        """Run the procedure: yield each tool call, get its result, return the outcome."""
        values, problems = self.bind(args)
        if problems:
            return self._stopped([], 0, "; ".join(problems), calls=0)
        done: list[dict[str, Any]] = []  # one record per call, in order
        results: dict[int, list[tuple[dict[str, Any], Any]]] = {}  # step -> (args, parsed)
        for i, step in enumerate(self.steps, start=1):
            try:
                calls = self._calls(step, values, results)
            except LookupError as exc:
                return self._stopped(done, i, str(exc))
            if not calls:
                return self._stopped(done, i, f"step {i} ({step.tool}) has nothing to run on")
            got: list[tuple[dict[str, Any], Any]] = []
            failed: str | None = None
            for call_args in calls:
                for attempt in range(step.retries + 1):
                    result: StepResult = yield StepCall(step.tool, call_args, i)
                    parsed = _parse(result.content)
                    error = _error_of(result, parsed)
                    if error is None:
                        break
                    if attempt < step.retries:
                        done.append(
                            {
                                "step": i,
                                "tool": step.tool,
                                "args": call_args,
                                "status": "retried",
                                "error": error,
                            }
                        )
                record = {"step": i, "tool": step.tool, "args": call_args}
                if error is None:
                    got.append((call_args, parsed))
                    done.append({**record, "status": "ok", "output": result.content})
                    continue
                if step.on_error == "skip":
                    done.append({**record, "status": "skipped", "error": error})
                    continue
                done.append({**record, "status": "error", "error": error})
                failed = error
                break
            if failed is None and not got:
                failed = f"every call of step {i} ({step.tool}) failed"
                for rec in done:  # nothing was left out on purpose: the whole step failed
                    if rec["step"] == i and rec["status"] == "skipped":
                        rec["status"] = "error"
            if failed is not None:
                return self._stopped(done, i, failed)
            results[i] = got
        return WorkflowOutcome(ok=True, content=self._report(done, "completed"), calls=len(done))

    def _calls(
        self,
        step: WorkflowStep,
        values: Mapping[str, Any],
        results: Mapping[int, list[tuple[dict[str, Any], Any]]],
    ) -> list[dict[str, Any]]:
        resolved = {name: self._value(src, values, results) for name, src in step.args.items()}
        if step.each is None:
            return [resolved]
        items = resolved[step.each]
        if not isinstance(items, list):
            items = [items]
        return [{**resolved, step.each: item} for item in items]

    @staticmethod
    def _value(
        src: ArgSource,
        values: Mapping[str, Any],
        results: Mapping[int, list[tuple[dict[str, Any], Any]]],
    ) -> Any:
        if src.kind == "param":
            return values.get(str(src.param))
        if src.kind == "const":
            return src.value
        got: list[Any] = []
        for call_args, parsed in results.get(int(src.step or 0), []):
            got.extend(select(parsed, src.rows, str(src.field), src.where, call_args))
        if src.pick == "first":
            if not got:
                raise LookupError(f"no {src.field!r} in the result of step {src.step} to pass on")
            return got[0]
        unique = list(dict.fromkeys(json.dumps(v, sort_keys=True) for v in got))
        if src.pick == "sorted":
            unique.sort()
        return [json.loads(v) for v in unique]

    def read_from(self, step: int) -> set[int]:
        """The steps whose results what is left from ``step`` on (1-based; past the last:
        what comes after the workflow) reads: the result sources of steps ``step``… and
        :attr:`returns`."""
        later = self.steps[max(step, 1) - 1 :]
        sources = {s.step for t in later for s in t.args.values() if s.kind == "result"}
        return {j for j in sources if j is not None} | set(self.returns or range(1, step))

    def _report(self, done: list[dict[str, Any]], status: str, step: int = 0) -> str:
        keep = self.read_from(len(self.steps) + 1 if status == "completed" else step)
        calls = [
            rec if rec["step"] in keep else {k: v for k, v in rec.items() if k != "output"}
            for rec in done
        ]
        payload: dict[str, Any] = {"workflow": self.name, "status": status, "calls": calls}
        if any("output" in rec and rec["step"] not in keep for rec in done):
            payload["outputs"] = f"only of steps {sorted(keep)} (what comes next reads them)"
        if status == "completed" and self.next:
            payload["next"] = self.next
        return json.dumps(payload, ensure_ascii=False, default=str)

    def _stopped(
        self, done: list[dict[str, Any]], step: int, error: str, *, calls: int | None = None
    ) -> WorkflowOutcome:
        payload = json.loads(self._report(done, "stopped", step))
        payload["stopped_at"] = {
            "step": step,
            "tool": self.steps[step - 1].tool if step else None,
            "error": error,
        }
        payload["next"] = (
            "The workflow stopped: the calls above are all it did. Continue the procedure "
            f"of skill {self.skill!r} by hand from step {max(step, 1)} (load_skill has it)."
        )
        return WorkflowOutcome(
            ok=False,
            content=json.dumps(payload, ensure_ascii=False, default=str),
            calls=len(done) if calls is None else calls,
            stopped_at=step,
            error=error,
        )


def _parse(content: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content


def _error_of(result: StepResult, parsed: Any) -> str | None:
    """Why a call failed: the harness said so, or the tool answered ``{"error": ...}``."""
    if not result.ok:
        return result.content[:500]
    if isinstance(parsed, dict) and parsed.get("error"):
        return str(parsed["error"])[:500]
    return None


def select(
    parsed: Any,
    rows: str,
    field: str,
    where: Mapping[str, str] | None = None,
    call_args: Mapping[str, Any] | None = None,
) -> list[Any]:
    """The values of ``field`` in the rows at ``rows`` of one parsed result.

    ``rows`` is a dotted path whose segments may end in ``[*]`` (every element of a list):
    ``results[*]``, ``data.items[*]``, or ``""`` for the result itself. With ``where``,
    only rows whose fields equal the given arguments of the producing call count.

    Example:
        >>> select({"picks": [{"item_id": "a"}, {"item_id": "b"}]}, "picks[*]", "item_id")
        ['a', 'b']
    """
    current: list[Any] = [parsed]
    for segment in [s for s in rows.split(".") if s]:
        m = _SEGMENT.match(segment)
        if m is None:
            return []
        key, star = m.group(1), m.group(2)
        current = [c[key] for c in current if isinstance(c, dict) and key in c]
        if star:
            current = [x for c in current if isinstance(c, list) for x in c]
    out = []
    for row in current:
        if not isinstance(row, dict) or field not in row:
            continue
        if where and any(row.get(f) != (call_args or {}).get(a) for f, a in where.items()):
            continue
        out.append(row[field])
    return out
