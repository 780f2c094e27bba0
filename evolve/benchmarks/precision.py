"""``evoharness bench precision``: does the harness leave correct runs alone and stop real loops?

Scripted agents (``ScriptedChatModel``, so every run is reproducible) go through a real
``create_agent`` with :func:`~evoharness.harness.default_middleware`, under ``invoke`` and
``ainvoke``:

* correct runs of several shapes: long batches of one tool over distinct inputs, parallel
  calls, long tool chains, multi-turn threads that repeat a call per turn, polls whose
  answer keeps changing, unusual-but-correct runs (one retry after a transient error,
  case-sensitive look-ups whose results differ, identical results for distinct inputs,
  ids the request never mentions);
* faulty runs: the same call over and over, equivalent arguments (case, whitespace, JSON
  key order), A-B cycles, a poll whose answer stopped changing, malformed tool calls, an
  empty final reply with a terminal tool.

An intervention is any harness event that changes a run (a note, a stop, a rejected or
re-answered call, a nudge) or any harness note the model received. A correct run should
get none; a faulty run must get the handling listed for it. The baseline, in the same
run, is the previous default loop rule (one tool six times in a row counts as a loop).
Last line: ``false_interventions=N missed_loops=M`` (both 0 is the goal) plus the
baseline's counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver

from evoharness.harness import EventLog, HarnessConfig, default_middleware
from evoharness.sdk.testing import ScriptedChatModel, ScriptExhaustedError

Responder = Callable[[str, dict[str, Any], int], str]
"""(tool, args, how many calls of that tool came before) -> the tool's result."""

INTERVENTIONS = frozenset(
    {
        "loop_hint",
        "loop_stopped",
        "drift_light",
        "drift_severe",
        "tool_call_malformed",
        "reply_nudged",
        "reply_check_failed",
        "tool_rejected",
        "guard_blocked",
        "budget_tier",
    }
)
TOOL_ARGS: dict[str, tuple[str, ...]] = {
    "cd": ("path",),
    "rm": ("path",),
    "search": ("q",),
    "status": ("job",),
    "open_page": ("url",),
    "lookup": ("code",),
    "grep": ("pattern",),
    "write_file": ("path", "content"),
    "query": ("filter",),
    "finish": ("answer",),
    "send_email": ("to", "body"),
    "set_toggle": ("setting", "on"),
}
POLL_TOOLS = frozenset({"status"})
"""Tools the benchmark's harness declares safe to poll (``HarnessConfig.loop_poll_tools``)."""


def _tools(respond: Responder) -> list[BaseTool]:
    seen: dict[str, int] = {}

    def make(name: str, params: tuple[str, ...]) -> BaseTool:
        def fn(**kwargs: Any) -> str:
            n = seen.get(name, 0)
            seen[name] = n + 1
            return respond(name, kwargs, n)

        schema = {
            "type": "object",
            "properties": {p: {"type": "string"} for p in params},
            "required": list(params),
        }
        return StructuredTool.from_function(
            func=fn, name=name, description=f"The {name} tool.", args_schema=schema
        )

    return [make(n, p) for n, p in TOOL_ARGS.items()]


def call(name: str, i: int | str = 0, **args: Any) -> AIMessage:
    """A reply with one tool call."""
    return calls((name, args), tag=str(i))


def calls(*pairs: tuple[str, dict[str, Any]], tag: str = "") -> AIMessage:
    """A reply with several (parallel) tool calls."""
    return AIMessage(
        content="",
        tool_calls=[
            {"name": n, "args": a, "id": f"{n}-{tag}-{k}", "type": "tool_call"}
            for k, (n, a) in enumerate(pairs)
        ],
    )


def malformed(i: int) -> AIMessage:
    """A reply whose only tool call did not parse."""
    return AIMessage(
        content="",
        invalid_tool_calls=[
            {
                "name": "search",
                "args": '{"q": "kettle"',
                "id": f"bad-{i}",
                "error": "Expecting ',' delimiter",
                "type": "invalid_tool_call",
            }
        ],
    )


def _ok(name: str, args: dict[str, Any], n: int) -> str:
    return "" if name in ("cd", "rm", "write_file") else f"{name} {sorted(args.items())}: ok"


@dataclass
class Scenario:
    """One scripted run: replies for all turns, and what the harness should do."""

    name: str
    correct: bool
    script: Sequence[AIMessage | str]
    turns: Sequence[str] = ("do the task",)
    respond: Responder = _ok
    expect: frozenset[str] = field(default_factory=frozenset)
    """Faulty runs: event kinds that must all appear (the handling)."""
    terminal_tool: str | None = None


def correct_runs() -> list[Scenario]:
    """Correct runs: the harness must not intervene in any of them."""
    files = [f"build/out/part-{i:02d}.log" for i in range(33)]
    batch = [
        call("cd", "cd", path="/var/tmp/job"),
        *[call("rm", i, path=f) for i, f in enumerate(files)],
    ]
    chain_tools = ("search", "lookup", "open_page", "query")
    chain = [
        call(t, i, **{TOOL_ARGS[t][0]: f"item {i}"})
        for i, t in ((i, chain_tools[i % 4]) for i in range(48))
    ]
    parallel = [
        calls(*[("lookup", {"code": f"SKU-{r}-{k}"}) for k in range(8)], tag=str(r))
        for r in range(5)
    ]
    poll_answers = ["queued", "running 10%", "running 40%", "running 80%", "done"]

    def poll(name: str, args: dict[str, Any], n: int) -> str:
        return poll_answers[min(n, len(poll_answers) - 1)] if name == "status" else "ok"

    def flaky_once(name: str, args: dict[str, Any], n: int) -> str:
        return "error: upstream timeout, try again" if n == 0 else f"{args}: 3 results"

    def case_sensitive(name: str, args: dict[str, Any], n: int) -> str:
        return f"{n + 1} matches for {args['pattern']!r} (case-sensitive)"

    same_content = [
        call("write_file", i, path=f"src/pkg{i}/__init__.py", content="") for i in range(20)
    ]
    turns = ("is the kettle in stock?", "check again please", "and now?", "one last time")
    per_turn: list[AIMessage | str] = []
    for t in range(len(turns)):
        per_turn += [call("search", f"t{t}", q="kettle stock"), f"answer {t}"]
    ids_only = [call("lookup", i, code=f"A{i:04d}") for i in range(12)]
    return [
        Scenario("batch: cd then rm x33 distinct files", True, [*batch, "deleted 33 files"]),
        Scenario("long tool chain: 48 steps, 4 tools", True, [*chain, "report ready"]),
        Scenario("parallel: 5 rounds x 8 distinct look-ups", True, [*parallel, "compared"]),
        Scenario(
            "poll whose answer keeps changing",
            True,
            [call("status", i, job="j-17") for i in range(5)] + ["the job is done"],
            respond=poll,
        ),
        Scenario("multi-turn: the same search once per turn", True, per_turn, turns=turns),
        Scenario(
            "one retry after a transient error",
            True,
            [call("search", 0, q="kettle"), call("search", 1, q="kettle"), "3 kettles"],
            respond=flaky_once,
        ),
        Scenario(
            "look-ups differing in case, with different results",
            True,
            [call("grep", i, pattern=p) for i, p in enumerate(["TODO", "todo", "ToDo"])]
            + ["found them"],
            respond=case_sensitive,
        ),
        Scenario(
            "20 distinct files written with the same content", True, [*same_content, "scaffolded"]
        ),
        Scenario(
            "ids the request never mentions, then the terminal tool",
            True,
            [*ids_only, call("finish", "f", answer="all 12 shipped"), "done"],
            turns=("are my parcels on their way?",),
            terminal_tool="finish",
        ),
    ]


def faulty_runs() -> list[Scenario]:
    """Faulty runs: each needs the handling in ``expect``."""
    stopped = frozenset({"loop_hint", "loop_stopped"})
    same = [call("search", i, q="kettle") for i in range(12)]
    variants = ["Kettle", " kettle", "KETTLE ", "kettle  ", "kEttle"]
    equivalent = [call("search", i, q=variants[i % 5]) for i in range(12)]
    json_variants = ['{"a": 1, "b": 2}', '{"b":2,"a":1}', '{ "a" : 1 , "b" : 2 }']
    as_json = [call("query", i, filter=json_variants[i % 3]) for i in range(12)]
    cycle = [
        call("search", i, q="kettle") if i % 2 == 0 else call("open_page", i, url="/p/1")
        for i in range(16)
    ]
    runaway = [call("status", i, job="j-9") for i in range(12)]
    # runaways of external benchmarks (AgentDojo, tau2): the reference calls, then the last
    # write repeated with the same arguments; every write returns a new object
    emails = [call("send_email", i, to="team@example.com", body="hi") for i in range(12)]
    toggles = [call("set_toggle", i, setting="wifi", on=i % 2 == 0) for i in range(16)]

    def new_object(name: str, args: dict[str, Any], n: int) -> str:
        return f'{{"{name}": "ok", "id": "obj-{n}"}}'

    def stuck(name: str, args: dict[str, Any], n: int) -> str:
        return "queued" if n == 0 else "running"

    def same_answer(name: str, args: dict[str, Any], n: int) -> str:
        return f"{name}: 3 results"  # what a search gives for the same query in any case

    return [
        Scenario("the same call over and over", False, same, expect=stopped),
        Scenario(
            "equivalent arguments (case, whitespace)",
            False,
            equivalent,
            respond=same_answer,
            expect=stopped,
        ),
        Scenario(
            "equivalent JSON arguments (key order, spacing)",
            False,
            as_json,
            respond=same_answer,
            expect=stopped,
        ),
        Scenario("A-B cycle with the same arguments", False, cycle, expect=stopped),
        Scenario(
            "a poll whose answer stopped changing", False, runaway, respond=stuck, expect=stopped
        ),
        Scenario(
            "the same write repeated, a new object each time",
            False,
            emails,
            respond=new_object,
            expect=stopped,
        ),
        Scenario(
            "a toggle flipped on and off, a new state each time",
            False,
            toggles,
            respond=new_object,
            expect=stopped,
        ),
        Scenario(
            "malformed tool calls, never fixed",
            False,
            [malformed(i) for i in range(6)],
            expect=frozenset({"tool_call_malformed", "reply_check_failed"}),
        ),
        Scenario(
            "a malformed call, then a good one",
            False,
            [malformed(0), call("search", 0, q="kettle"), "found"],
            expect=frozenset({"tool_call_malformed"}),
        ),
        Scenario(
            "an empty final reply with a terminal tool",
            False,
            [call("search", 0, q="kettle"), "", call("finish", 0, answer="kettle"), "ok"],
            expect=frozenset({"reply_empty", "reply_nudged"}),
            terminal_tool="finish",
        ),
    ]


@dataclass
class Outcome:
    """What the harness did in one run."""

    scenario: Scenario
    mode: str
    events: dict[str, int]
    notes: int

    @property
    def interventions(self) -> int:
        """Events that changed the run, plus harness notes the model received."""
        acted = sum(n for kind, n in self.events.items() if kind in INTERVENTIONS)
        return acted + self.notes

    @property
    def handled(self) -> bool:
        """Whether a faulty run got all its expected handling (and ended before its script)."""
        if self.events.get("script_exhausted"):
            return False
        return all(self.events.get(kind, 0) > 0 for kind in self.scenario.expect)


def run_one(scenario: Scenario, mode: str, config: HarnessConfig) -> Outcome:
    """Run ``scenario`` through create_agent + the harness (``invoke`` or ``ainvoke``).

    A faulty run the harness lets go on runs out of script (:class:`ScriptExhaustedError`):
    recorded as ``script_exhausted``, and the run counts as not handled.
    """
    model = ScriptedChatModel(script=list(scenario.script))
    events = EventLog()
    cfg = config.model_copy(update={"terminal_tool": scenario.terminal_tool})
    agent = create_agent(
        model,
        _tools(scenario.respond),
        middleware=default_middleware(cfg, events=events),
        checkpointer=InMemorySaver(),
    )
    run_cfg: RunnableConfig = {"configurable": {"thread_id": scenario.name}, "recursion_limit": 500}
    try:
        for turn in scenario.turns:
            payload: Any = {"messages": [HumanMessage(turn)]}
            if mode == "invoke":
                agent.invoke(payload, run_cfg)
            else:
                asyncio.run(agent.ainvoke(payload, run_cfg))
    except ScriptExhaustedError:
        events.emit("script_exhausted", "precision-bench")
    notes = sum(
        isinstance(m, SystemMessage) and str(m.content).startswith("[harness note]")
        for c in model.calls
        for m in c
    )
    return Outcome(scenario, mode, events.counts(), notes)


def measure(config: HarnessConfig) -> tuple[int, int, list[Outcome]]:
    """(false interventions, missed faulty runs, every outcome) for one harness config."""
    outcomes = [
        run_one(s, mode, config)
        for s in [*correct_runs(), *faulty_runs()]
        for mode in ("invoke", "ainvoke")
    ]
    false = sum(o.interventions for o in outcomes if o.scenario.correct)
    missed = sum(not o.handled for o in outcomes if not o.scenario.correct)
    return false, missed, outcomes


def run(*, echo: Callable[[str], None] = print) -> tuple[int, int]:
    """Run the benchmark, print the report, and return (false interventions, missed)."""
    config = HarnessConfig(breaker=None, loop_poll_tools=POLL_TOOLS)
    false, missed, outcomes = measure(config)
    base_false, base_missed, base_outcomes = measure(
        config.model_copy(update={"loop_same_tool": 6})
    )
    echo(f"{len(outcomes) // 2} scenarios x (invoke, ainvoke) through default_middleware")
    for o, b in zip(outcomes, base_outcomes, strict=True):
        if o.mode != "invoke":
            continue
        kind = "correct" if o.scenario.correct else "faulty "
        if o.scenario.correct:
            verdict = "left alone" if o.interventions == 0 else f"{o.interventions} interventions"
        else:
            verdict = "handled" if o.handled else "MISSED"
        acted = ", ".join(f"{k} {n}" for k, n in sorted(o.events.items())) or "-"
        base = (
            str(b.interventions) if o.scenario.correct else ("handled" if b.handled else "MISSED")
        )
        echo(f"  {kind} {o.scenario.name:55s} {verdict:18s} ({acted})  baseline: {base}")
    echo(
        f"baseline (one tool 6x in a row is a loop): false_interventions={base_false} "
        f"missed_loops={base_missed}"
    )
    echo(f"false_interventions={false} missed_loops={missed}")
    return false, missed
