"""Procedures from runs: each run's tool calls as steps, and the procedure a cluster shares.

A run's *steps* are its tool calls grouped by tool, in order: consecutive calls of one
tool form one step (a fan-out: one search per platform, one shipping quote per pick), an
identical repeat of a call (a retry) collapses into it, and a call that failed alone — a
tool that does not exist, a backend that was down — is no step of the procedure. Calls of
workflow tools and ``load_skill`` are bookkeeping, not steps.

The *procedure* of a cluster of runs is the step sequence most of them followed, each step
marked with how many runs had it; every step that all the runs share is in it (they all
are in every run, so in the most common one too).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evoharness.evolve.episodes.traces import ToolCallRecord
from evoharness.harness.context.skills import LOAD_SKILL
from evoharness.sdk.skills import WORKFLOW_PREFIX

__all__ = [
    "ProcedureStep",
    "RunCall",
    "RunStep",
    "common_prefix",
    "is_bookkeeping",
    "parse_output",
    "procedure_of",
    "run_steps",
    "shared_steps",
]


def parse_output(output: Any) -> Any:
    """A recorded tool output as data (JSON text parsed; anything else as it is)."""
    if isinstance(output, str):
        try:
            return json.loads(output)
        except ValueError:
            return output
    return output


@dataclass(frozen=True)
class RunCall:
    """One recorded call: its arguments, its parsed output, and whether it succeeded."""

    tool: str
    args: dict[str, Any]
    output: Any
    ok: bool

    @property
    def key(self) -> str:
        """The call's identity (tool and canonical arguments)."""
        return f"{self.tool}\x1f{json.dumps(self.args, sort_keys=True, default=str)}"


@dataclass(frozen=True)
class RunStep:
    """Consecutive calls of one tool in a run (retries collapsed).

    Attributes:
        tool: The tool.
        calls: Its distinct calls, in order.
        recovered: Calls that failed and then worked when repeated as they were.
    """

    tool: str
    calls: tuple[RunCall, ...]
    recovered: int = 0


def is_bookkeeping(tool: str) -> bool:
    """Whether ``tool`` is skills machinery (a workflow or ``load_skill``), not a step."""
    return tool == LOAD_SKILL or tool.startswith(WORKFLOW_PREFIX)


def _call_of(record: ToolCallRecord) -> RunCall:
    parsed = parse_output(record.output)
    failed = record.error or (isinstance(parsed, dict) and bool(parsed.get("error")))
    return RunCall(record.name, dict(record.args), parsed, not failed)


def run_steps(
    calls: Sequence[ToolCallRecord], *, ignore: Callable[[str], bool] = is_bookkeeping
) -> list[RunStep]:
    """The steps of one run (see the module docstring)."""
    groups: list[tuple[list[RunCall], list[int]]] = []  # calls, [recovered]
    for record in calls:
        if ignore(record.name):
            continue
        call = _call_of(record)
        if groups and groups[-1][0][0].tool == call.tool:
            group, recovered = groups[-1]
            same = next((i for i, c in enumerate(group) if c.key == call.key), None)
            if same is None:
                group.append(call)
            elif call.ok and not group[same].ok:  # a retry that worked replaces the attempt
                group[same] = call
                recovered[0] += 1
            continue
        groups.append(([call], [0]))
    steps = [RunStep(g[0].tool, tuple(g), r[0]) for g, r in groups if any(c.ok for c in g)]
    merged: list[RunStep] = []  # dropping a failed call can make two groups adjacent
    for s in steps:
        if merged and merged[-1].tool == s.tool:
            last = merged[-1]
            known = {c.key for c in last.calls}
            extra = tuple(c for c in s.calls if c.key not in known)
            merged[-1] = RunStep(s.tool, last.calls + extra, last.recovered + s.recovered)
        else:
            merged.append(s)
    return merged


def shared_steps(sequences: Sequence[Sequence[str]]) -> Counter[str]:
    """Each tool's step count that every sequence has (the steps all runs share)."""
    if not sequences:
        return Counter()
    shared = Counter(sequences[0])
    for seq in sequences[1:]:
        shared &= Counter(seq)
    return shared


@dataclass(frozen=True)
class ProcedureStep:
    """One step of a cluster's procedure.

    Attributes:
        tool: Its tool.
        runs: How many of the cluster's runs have a step of this tool.
        total: The cluster's runs.
    """

    tool: str
    runs: int
    total: int

    @property
    def required(self) -> bool:
        """Every run of the cluster has it."""
        return self.runs == self.total


def procedure_of(sequences: Sequence[Sequence[str]]) -> list[ProcedureStep]:
    """The cluster's procedure: its most common step sequence (ties: the longer one, then
    the first in order), each step annotated with its support."""
    if not sequences:
        return []
    counts = Counter(tuple(s) for s in sequences)
    order = {tuple(s): i for i, s in reversed(list(enumerate(sequences)))}
    modal = max(counts, key=lambda s: (counts[s], len(s), -order[s]))
    having = Counter(t for s in sequences for t in set(s))
    return [ProcedureStep(t, having[t], len(sequences)) for t in modal]


def common_prefix(sequences: Sequence[Sequence[str]]) -> list[str]:
    """The steps every sequence starts with, in order."""
    if not sequences:
        return []
    out: list[str] = []
    for column in zip(*sequences, strict=False):
        if len(set(column)) != 1:
            break
        out.append(column[0])
    return out
