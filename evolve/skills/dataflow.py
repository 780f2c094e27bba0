"""Argument dataflow: where each argument of each step came from, across a cluster's runs.

For every step the runs share (in order) and every argument, the first source that
explains *every* run:

1. **the request** — the value is in the user's words in every run (an order id, a
   budget): a workflow parameter the agent fills from the request;
2. **an earlier result** — the value is a field of an earlier step's successful results
   (a customer id from ``lookup_order``, every ``item_id`` the searches returned, each
   pick of ``item_picker``): ``first``, ``all``, ``sorted`` or ``each`` (the step runs
   once per value);
3. **a constant** — the same value in every run (``limit: 10``): a parameter with that
   default;
4. **known up front** — the value appears in no earlier result (a platform to search):
   a parameter the agent sets;
5. otherwise the argument is **derived** — composed from what earlier steps returned (a
   summary of the picks, a reply): the model's work, and where a workflow must stop.

A step whose calls vary in more than one argument is not compiled either.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from evoharness.evolve.episodes.steps import RunCall, RunStep
from evoharness.sdk.skills import ArgSource, Param, select

__all__ = ["ClusterRun", "Dataflow", "StepFlow", "infer_dataflow", "leaves", "mentions"]

_PICKS = ("first", "all", "sorted")


@dataclass(frozen=True)
class ClusterRun:
    """One run of a cluster: its trace, its request, its steps and its final answer."""

    trace_id: str
    request: str
    steps: list[RunStep]
    answer: str = ""


@dataclass
class StepFlow:
    """The dataflow of one step.

    Attributes:
        tool: The step's tool.
        args: Argument -> its source (``None``: derived by the model).
        each: The argument the step fans out over, if it does.
        on_error: ``skip`` when some run went on past a failed value of the fan-out.
        retries: 1 when some run repeated a failed call as it was and it then worked.
        problem: Why the step cannot be compiled (``None``: it can).
    """

    tool: str
    args: dict[str, ArgSource | None] = field(default_factory=dict)
    each: str | None = None
    on_error: str = "stop"
    retries: int = 0
    problem: str | None = None


@dataclass
class Dataflow:
    """A cluster's dataflow over its shared steps, and the parameters it implies."""

    steps: list[StepFlow]
    params: list[Param]
    values: list[dict[str, Any]]
    """Per run: the value of each parameter (what the agent would have passed)."""

    @property
    def compilable(self) -> int:
        """How many leading steps can run without the model."""
        return next((i for i, s in enumerate(self.steps) if s.problem), len(self.steps))


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def leaves(x: Any) -> Iterator[Any]:
    """The scalar values inside a parsed result (strings and numbers)."""
    if isinstance(x, dict):
        for v in x.values():
            yield from leaves(v)
    elif isinstance(x, list):
        for v in x:
            yield from leaves(v)
    elif isinstance(x, str | int | float) and not isinstance(x, bool):
        yield x


def _informative(v: Any) -> bool:
    """Whether finding ``v`` in a result says it came from there (not a small count)."""
    if isinstance(v, str):
        return len(v.strip()) >= 3
    if isinstance(v, int | float) and not isinstance(v, bool):
        return abs(v) >= 10 or float(v) != int(v)
    return False


def _telling(v: Any) -> bool:
    return any(_informative(x) for x in leaves(v))


def mentions(text: str, value: Any) -> bool:
    """Whether the user's ``text`` states ``value`` (lists: every element)."""
    low = text.lower()
    if isinstance(value, list):
        return bool(value) and all(mentions(text, v) for v in value)
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int | float):
        number = f"{value:g}" if isinstance(value, float) else str(value)
        return re.search(rf"(?<![\d.]){re.escape(number)}(?:\.0+)?(?![\d])", low) is not None
    if isinstance(value, str):
        v = value.lower().strip()
        return len(v) >= 2 and (v in low or v.replace("_", " ") in low)
    return False


def _paths(x: Any, rows: str = "") -> Iterator[tuple[str, str]]:
    """Every ``(rows, field)`` in a parsed result, in :func:`select`'s path syntax."""
    if isinstance(x, dict):
        for k, v in x.items():
            if not re.fullmatch(r"[A-Za-z0-9_\-]+", str(k)):
                continue
            yield rows, str(k)
            child = f"{rows}.{k}" if rows else str(k)
            if isinstance(v, dict):
                yield from _paths(v, child)
            elif isinstance(v, list):
                for el in v[:50]:
                    if isinstance(el, dict):
                        yield from _paths(el, f"{child}[*]")


def _results(step: RunStep) -> list[RunCall]:
    return [c for c in step.calls if c.ok]


def _values(step: RunStep, rows: str, fld: str) -> list[Any]:
    out: list[Any] = []
    for c in _results(step):
        out.extend(select(c.output, rows, fld))
    return out


def _unique(values: list[Any], *, ordered: bool) -> list[Any]:
    seen = list(dict.fromkeys(_canon(v) for v in values))
    if not ordered:
        seen.sort()
    return [json.loads(v) for v in seen]


def _fits(value: Any, got: list[Any], pick: str) -> bool:
    if pick == "each":
        return (
            isinstance(value, list)
            and len({_canon(v) for v in value}) == len(value)
            and {_canon(v) for v in value} == {_canon(v) for v in got}
        )
    if pick == "first":
        return bool(got) and _canon(got[0]) == _canon(value)
    return isinstance(value, list) and _canon(_unique(got, ordered=pick == "all")) == _canon(value)


def _json_type(values: Sequence[Any]) -> tuple[str, str | None] | None:
    present = [v for v in values if v is not None]
    if not present:
        return "string", None
    if all(isinstance(v, bool) for v in present):
        return "boolean", None
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "integer", None
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return "number", None
    if all(isinstance(v, str) for v in present):
        return "string", None
    if all(isinstance(v, list) for v in present):
        inner = _json_type([x for v in present for x in v])
        return ("array", inner[0]) if inner is not None and inner[0] != "array" else None
    if all(isinstance(v, dict) for v in present):
        return "object", None
    return None


def _plural(name: str) -> str:
    return f"{name}_list" if name.endswith("s") else f"{name}s"


class _Inference:
    """One cluster's inference (state shared by the steps: parameters, values per run)."""

    def __init__(self, runs: Sequence[ClusterRun]) -> None:
        self.runs = runs
        self.params: dict[str, Param] = {}
        self.values: list[dict[str, Any]] = [{} for _ in runs]

    def param(self, name: str, per_run: list[Any], what: str, *, each: bool) -> ArgSource | None:
        """A parameter for ``per_run`` values (reusing one that always has them)."""
        kind = _json_type(per_run)
        if kind is None:
            return None
        constant = len({_canon(v) for v in per_run}) == 1
        for existing in self.params:
            same = all(
                _canon(vals.get(existing)) == _canon(v)
                for vals, v in zip(self.values, per_run, strict=True)
            )
            if same and (existing in (name, _plural(name)) or not constant):
                return ArgSource(kind="param", param=existing)
        base = _plural(name) if each else name
        unique, k = base, 2
        while unique in self.params:
            unique, k = f"{base}_{k}", k + 1
        optional = constant or any(v is None for v in per_run)
        self.params[unique] = Param(
            name=unique,
            type=kind[0],
            items=kind[1],
            required=not optional,
            default=per_run[0] if constant else None,
            description=what,
        )
        for vals, v in zip(self.values, per_run, strict=True):
            vals[unique] = v
        return ArgSource(kind="param", param=unique)

    def result(self, i: int, per_run: list[Any], picks: Sequence[str]) -> ArgSource | None:
        """An earlier step's field that gives ``per_run`` in every run, latest step first."""
        first = self.runs[0]
        for j in range(i - 1, -1, -1):
            candidates = dict.fromkeys(
                p for c in _results(first.steps[j]) for p in _paths(c.output)
            )
            for rows, fld in candidates:
                for pick in picks:
                    if all(
                        _fits(v, _values(run.steps[j], rows, fld), pick)
                        for run, v in zip(self.runs, per_run, strict=True)
                    ):
                        return ArgSource(
                            kind="result",
                            step=j + 1,
                            rows=rows,
                            field=fld,
                            pick=pick,
                        )
        return None

    def upfront(self, i: int, per_run: list[Any]) -> bool:
        """Every run's value was known before the procedure started: each part of it is in
        the request, or is no (telling) value of an earlier result and no composed text."""
        for run, v in zip(self.runs, per_run, strict=True):
            seen = {
                _canon(x)
                for s in run.steps[:i]
                for c in _results(s)
                for x in leaves(c.output)
                if _informative(x)
            }
            for x in v if isinstance(v, list) else [v]:
                if isinstance(x, dict | list):
                    return False  # composed values are the model's work
                if mentions(run.request, x):
                    continue
                if isinstance(x, str) and len(x.split()) > 1:
                    return False  # words the model wrote
                if _informative(x) and _canon(x) in seen:
                    return False
        return True

    def step(self, i: int) -> StepFlow:
        steps = [run.steps[i] for run in self.runs]
        flow = StepFlow(tool=steps[0].tool)
        names = [sorted(c.args) for s in steps for c in s.calls]
        if any(n != names[0] for n in names):
            flow.problem = "its calls do not always pass the same arguments"
            return flow
        varying = sorted(
            {a for s in steps for a in names[0] if len({_canon(c.args[a]) for c in s.calls}) > 1}
        )
        if len(varying) > 1 or (any(len(s.calls) > 1 for s in steps) and not varying):
            flow.problem = f"its calls vary in {', '.join(varying) or 'nothing'}"
            return flow
        flow.each = varying[0] if varying else None
        if flow.each and any(not c.ok for s in steps for c in s.calls):
            flow.on_error = "skip"
        flow.retries = 1 if any(s.recovered for s in steps) else 0
        for arg in names[0]:
            if arg == flow.each:
                per_run: list[Any] = [[c.args[arg] for c in s.calls] for s in steps]
                src = self.result(i, per_run, ("each",))
                if src is None and self.upfront(i, per_run):
                    src = self.param(arg, per_run, self._say(per_run), each=True)
            else:
                per_run = [s.calls[0].args[arg] for s in steps]
                src = self.scalar(i, arg, per_run)
            flow.args[arg] = src
        derived = [a for a, s in flow.args.items() if s is None]
        if derived:
            flow.problem = f"{', '.join(derived)} composed from earlier results"
        return flow

    def scalar(self, i: int, arg: str, per_run: list[Any]) -> ArgSource | None:
        if all(mentions(r.request, v) for r, v in zip(self.runs, per_run, strict=True)):
            return self.param(arg, per_run, "from the request", each=False)
        if any(_telling(v) for v in per_run):
            src = self.result(i, per_run, _PICKS)
            if src is not None:
                return src
        constant = len({_canon(v) for v in per_run}) == 1
        if constant or self.upfront(i, per_run):
            return self.param(arg, per_run, self._say(per_run), each=False)
        return None

    def _say(self, per_run: list[Any]) -> str:
        if len({_canon(v) for v in per_run}) == 1:
            return f"{_canon(per_run[0])} in every supporting run"
        stated = sum(mentions(r.request, v) for r, v in zip(self.runs, per_run, strict=True))
        return f"set up front ({stated} of {len(per_run)} runs stated it in the request)"


def infer_dataflow(runs: Sequence[ClusterRun], upto: int) -> Dataflow:
    """The dataflow of the first ``upto`` steps (which every run has, in order)."""
    inference = _Inference(runs)
    flows: list[StepFlow] = []
    for i in range(upto):
        flow = inference.step(i)
        flows.append(flow)
        if flow.problem:
            break
    return Dataflow(flows, list(inference.params.values()), inference.values)


def _found_in(x: Any, wanted: set[str], texts: Sequence[str]) -> bool:
    if _canon(x) in wanted:
        return True
    word = str(x) if isinstance(x, str | int | float) and not isinstance(x, bool) else ""
    pattern = rf"(?<![\w.]){re.escape(word)}(?![\w])" if word else ""
    return bool(pattern) and any(re.search(pattern, t) for t in texts)


def feeds(runs: Sequence[ClusterRun], into: int, sources: int) -> list[int]:
    """The steps (1-based, among the first ``sources``) whose results step ``into`` (or,
    past the last step, the final answer) reads.

    A result feeds the step when one of its telling values is an argument's value or a
    word of an argument's text (a pick's reason naming its rating); looking from the
    latest step back, a step counts only for values no later step already gave. A value the
    request states is the request's, not the result's (the model has it either way).
    """
    used: set[int] = set()
    for run in runs:
        # after the last step, what the agent reads the results for is its answer
        args: list[Any] = (
            [c.args for c in run.steps[into].calls] if into < len(run.steps) else [run.answer]
        )
        wanted = {_canon(x) for a in args for x in leaves(a) if _informative(x)}
        texts = [x for a in args for x in leaves(a) if isinstance(x, str)]
        covered: set[str] = set()
        for j in range(min(sources, len(run.steps)) - 1, -1, -1):
            got = {
                _canon(x)
                for c in _results(run.steps[j])
                for x in leaves(c.output)
                if _informative(x) and _found_in(x, wanted, texts) and not mentions(run.request, x)
            }
            if got - covered:
                used.add(j + 1)
            covered |= got
    return sorted(used)
