"""Skills from traces: each case pattern's verified good runs become one skill.

For every case pattern with at least ``min_support`` runs the judge verified as successful
(task success shown by evidence, no P0 failure; the clean ones — no P1 failure either —
when there are enough of them), the distiller writes a skill in the Agent Skills format:

- the **procedure** the good runs followed (every step they all share, each marked with
  its support; steps only some took are listed as optional),
- the **argument dataflow** of the steps they share (which value comes from the request,
  which from which earlier result; :mod:`~evoharness.evolve.skills.dataflow`),
- the **pitfalls** the pattern's failed runs hit (their failed rubric items' hints, steps
  they skipped, tools that do not exist),
- and, where the routine leading steps need no model, a **workflow** proven by replay
  (:mod:`~evoharness.evolve.skills.compile`).

Skills are offered only where their case pattern matches (``metadata.case_pattern``).
Undecided runs are never evidence either way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evoharness.evolve import Episode, Verdict
from evoharness.evolve.episodes.steps import (
    ProcedureStep,
    common_prefix,
    is_bookkeeping,
    procedure_of,
    run_steps,
    shared_steps,
)
from evoharness.evolve.skills.compile import compile_workflow
from evoharness.evolve.skills.dataflow import ClusterRun, Dataflow, StepFlow, infer_dataflow
from evoharness.sdk.skills import WORKFLOW_FILE, ArgSource, Param, Skill, Workflow, skill_name

__all__ = ["LearnedSkill", "SkillDistiller"]

CaseKey = Callable[[str, Mapping[str, Any]], str]


@dataclass
class LearnedSkill:
    """One distilled skill and the evidence behind it.

    Attributes:
        skill: The skill (its workflow, if any, in ``files["workflow.json"]``).
        pattern: The case pattern it is offered for.
        procedure: The procedure, with support counts.
        support: Trace ids of the good runs it was learned from.
        failed: Trace ids of the pattern's failed runs (its pitfalls).
        workflow: The compiled workflow, when one was proven.
        no_workflow: Why there is none.
    """

    skill: Skill
    pattern: str
    procedure: list[ProcedureStep]
    support: list[str]
    failed: list[str] = field(default_factory=list)
    workflow: Workflow | None = None
    no_workflow: str = ""


def _good(v: Verdict | None) -> bool:
    return v is not None and v.success is True and v.p0_pass


def _bad(v: Verdict | None) -> bool:
    return v is not None and v.success is False


class SkillDistiller:
    """Turns judged episodes into skills, one per case pattern.

    Args:
        env: The environment's name (skill names start with it).
        case_key: ``(query, trace metadata) -> case pattern`` (the environment's).
        hints: Rubric item id -> imperative hint (what a failed run should have done).
        min_support: Good runs a pattern needs before it gets a skill.
        min_workflow_steps: Routine steps a workflow must cover to be worth one (two: it
            saves the agent at least one model call).
        workflows: Compile workflows at all.
    """

    def __init__(
        self,
        *,
        env: str,
        case_key: CaseKey,
        hints: Mapping[str, str] | None = None,
        min_support: int = 3,
        min_workflow_steps: int = 2,
        workflows: bool = True,
    ) -> None:
        self.env = env
        self.case_key = case_key
        self.hints = dict(hints or {})
        self.min_support = min_support
        self.min_workflow_steps = min_workflow_steps
        self.workflows = workflows

    def distill(
        self, episodes: Iterable[Episode], verdicts: Mapping[str, Verdict]
    ) -> list[LearnedSkill]:
        """One skill per case pattern with enough verified good runs, by name."""
        good: dict[str, list[Episode]] = {}
        bad: dict[str, list[Episode]] = {}
        for e in episodes:
            v = verdicts.get(e.trace_id)
            if not (_good(v) or _bad(v)):
                continue
            key = self.case_key(e.query or "", e.metadata)
            (good if _good(v) else bad).setdefault(key, []).append(e)
        out = []
        for pattern, runs in sorted(good.items()):
            clean = [e for e in runs if not verdicts[e.trace_id].p1_failures]
            support = clean if len(clean) >= self.min_support else runs
            if len(support) >= self.min_support:
                out.append(self.skill_for(pattern, support, bad.get(pattern, []), verdicts))
        return sorted(out, key=lambda s: s.skill.name)

    def skill_for(
        self,
        pattern: str,
        good: Sequence[Episode],
        bad: Sequence[Episode],
        verdicts: Mapping[str, Verdict],
    ) -> LearnedSkill:
        """The skill of one case pattern."""
        runs = [
            ClusterRun(
                e.trace_id,
                e.query or "",
                run_steps(e.tool_calls),
                e.final_answer if isinstance(e.final_answer, str) else "",
            )
            for e in sorted(good, key=lambda e: (e.start_time, e.trace_id))
        ]
        sequences = [[s.tool for s in r.steps] for r in runs]
        procedure = procedure_of(sequences)
        prefix = common_prefix(sequences)
        flow = infer_dataflow(runs, len(prefix))
        name = skill_name(f"{self.env}-{pattern}")
        workflow: Workflow | None = None
        why = "workflows are off"
        if self.workflows:
            workflow, why = compile_workflow(
                name, runs, flow, [p.tool for p in procedure], min_steps=self.min_workflow_steps
            )
        tools = [p.tool for p in procedure]
        body = _body(
            pattern,
            procedure,
            flow,
            workflow,
            runs,
            _pitfalls(bad, verdicts, self.hints, shared_steps(sequences)),
        )
        description = (
            f"For {pattern} requests: {', then '.join(dict.fromkeys(tools))} "
            f"(verified on {len(runs)} good runs)."
        )
        skill = Skill(
            name=name,
            description=description[:1024],
            body=body,
            allowed_tools=list(dict.fromkeys(tools)),
            metadata={
                "case_pattern": pattern,
                "source": "evoharness evolve (learned from traces)",
                "support": str(len(runs)),
                "failed_runs": str(len(bad)),
                "traces": " ".join(r.trace_id for r in runs[:5]),
            },
            files={WORKFLOW_FILE: workflow.to_json()} if workflow is not None else {},
        )
        return LearnedSkill(
            skill=skill,
            pattern=pattern,
            procedure=procedure,
            support=[r.trace_id for r in runs],
            failed=[e.trace_id for e in bad],
            workflow=workflow,
            no_workflow=why,
        )


def _source_text(src: ArgSource | None, params: Mapping[str, Param]) -> str:
    if src is None:
        return "composed from earlier results (your work)"
    if src.kind == "param":
        p = params.get(str(src.param))
        detail = f" ({p.description})" if p is not None and p.description else ""
        return f"`{src.param}`{detail}"
    return src.describe()


def _step_line(
    k: int, step: ProcedureStep, flow: StepFlow | None, params: Mapping[str, Param]
) -> str:
    head = f"{k}. `{step.tool}`"
    if not step.required:
        return f"{head} (optional: {step.runs} of {step.total} runs)"
    if flow is None:
        return head
    if flow.each:
        head += f", once for each value of {_source_text(flow.args.get(flow.each), params)}"
    args = [f"`{a}` = {_source_text(s, params)}" for a, s in flow.args.items() if a != flow.each]
    line = head + (" — " + "; ".join(args) if args else "")
    if flow.retries:
        line += ". A call that failed was repeated once as it was, and then worked."
    if flow.on_error == "skip":
        line += ". A value that kept failing was left out and the run went on."
    return line


def _body(
    pattern: str,
    procedure: Sequence[ProcedureStep],
    flow: Dataflow,
    workflow: Workflow | None,
    runs: Sequence[ClusterRun],
    pitfalls: Sequence[str],
) -> str:
    params = {p.name: p for p in flow.params}
    flows: list[StepFlow | None] = [*flow.steps]
    lines = [
        f"# {pattern} requests",
        "",
        f"Learned by evoharness from {len(runs)} verified good runs of `{pattern}` requests; "
        "every step they all share is below, in order.",
        "",
        "## When to use",
        f"Requests whose case pattern is `{pattern}`. The user's request always wins.",
        "",
        "## Procedure",
    ]
    j = 0
    for k, step in enumerate(procedure, start=1):
        f = None
        if step.required and j < len(flows) and flows[j] is not None and flows[j].tool == step.tool:  # type: ignore[union-attr]
            f, j = flows[j], j + 1
        lines.append(_step_line(k, step, f, params))
    others = Counter(t for r in runs for t in {s.tool for s in r.steps}) - Counter(
        {p.tool: len(runs) for p in procedure}
    )
    if others:
        lines += ["", "Other steps some runs took (when their results called for it):"]
        lines += [f"- `{t}` ({n} of {len(runs)} runs)" for t, n in sorted(others.items())]
    if workflow is not None:
        names = ", ".join(p.name for p in workflow.params)
        lines += [
            "",
            "## Workflow",
            f"`{workflow.name}({names})` runs steps 1-{len(workflow.steps)} in one call, each "
            "tool call still checked and traced. If a step fails it stops and returns what it "
            "did: go on by hand from that step. " + workflow.next,
        ]
    if pitfalls:
        lines += ["", "## Pitfalls (from failed runs of this pattern)"]
        lines += [f"- {p}" for p in pitfalls]
    return "\n".join(lines) + "\n"


def _pitfalls(
    bad: Sequence[Episode],
    verdicts: Mapping[str, Verdict],
    hints: Mapping[str, str],
    shared: Counter[str],
) -> list[str]:
    items: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    unknown: Counter[str] = Counter()
    for e in bad:
        v = verdicts[e.trace_id]
        items.update(set(v.p0_failures) | set(v.p1_failures))
        tools = Counter(s.tool for s in run_steps(e.tool_calls))
        skipped.update(t for t in shared if tools[t] < shared[t])
        unknown.update(
            {
                c.name
                for c in e.tool_calls
                if c.error
                and not is_bookkeeping(c.name)
                and "unknown tool" in str(c.output).lower()
            }
        )
    out = []
    for item, n in items.most_common():
        hint = hints.get(item)
        out.append(
            f"{hint} ({n} failed run(s): {item})" if hint else f"Avoid {item} ({n} failed run(s))."
        )
    out += [f"Do not skip `{t}` ({n} failed run(s) did)." for t, n in skipped.most_common()]
    out += [
        f"`{t}` does not exist ({n} failed run(s) called it)." for t, n in unknown.most_common()
    ]
    return out
