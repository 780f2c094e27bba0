"""SIMULATED offline policy: a heuristic "model" that plays the shop tools.

This is a simulator for demos and tests. It exercises the harness and evolve machinery with
seeded, configurable mistakes (skipping ``shipping_calc``, ignoring an excluded material,
retrying a failing platform in a loop, calling a tool that does not exist, answering without
``shopping_summary``). Its numbers are evidence about the machinery, never about real models.

It reads its context the way a model would: the request from the first human message, tool
results from tool messages, and guidance from system messages. A lesson in the system prompt
(a section headed ``LESSONS``) that names the step behind a mistake lowers that mistake's rate
by ``lesson_effect``; a harness hint asking to "change approach" stops a retry loop.

Offered skills (a ``SKILLS`` section, only when the session door serves a skill set): when
one of them comes with a workflow tool, the policy calls it once, filling its parameters
from its own reading of the request (with the same seeded mistakes), and carries on from
what the workflow did — a stopped workflow leaves it to do the rest by hand; a skill
without a workflow it loads first, and its instructions count like lessons. Without a
``SKILLS`` section nothing changes.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel, ConfigDict, Field

from evoharness.examples.shop.catalogue import CATEGORIES, PLATFORMS
from evoharness.examples.shop.tools import TERMINAL_TOOL

HALLUCINATED_TOOL = "find_deals"
LESSON_HEADER = "LESSONS"
SKILLS_HEADER = "SKILLS"
LOAD_SKILL = "load_skill"
WORKFLOW_PREFIX = "wf_"
SKIPPED = "skipped by the workflow"
CHANGE_APPROACH = "change approach"
# mistake -> the step a lesson must name to reduce it
LESSON_KEYS: dict[str, str] = {
    "skip_shipping_calc": "shipping_calc",
    "ignore_excluded_material": "excluded_materials",
    "retry_failing_platform": "retry",
    "hallucinated_tool": HALLUCINATED_TOOL,
    "no_summary": TERMINAL_TOOL,
}


class MistakeRates(BaseModel):
    """Probability of each simulated mistake per task (decided once per task, seeded)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    skip_shipping_calc: float = Field(0.2, ge=0, le=1)
    ignore_excluded_material: float = Field(0.25, ge=0, le=1)
    retry_failing_platform: float = Field(0.5, ge=0, le=1)
    hallucinated_tool: float = Field(0.1, ge=0, le=1)
    no_summary: float = Field(0.1, ge=0, le=1)

    @classmethod
    def perfect(cls) -> MistakeRates:
        """A policy that makes no mistakes (the environment's oracle path)."""
        return cls(
            skip_shipping_calc=0,
            ignore_excluded_material=0,
            retry_failing_platform=0,
            hallucinated_tool=0,
            no_summary=0,
        )


@dataclass(frozen=True)
class ParsedRequest:
    """What the policy understood from the customer's words."""

    category: str | None
    count: int
    budget_cny: float | None
    excluded_materials: tuple[str, ...]
    platforms: tuple[str, ...]
    direct_shipping: bool


def parse_request(text: str) -> ParsedRequest:
    """Read the constraints from a request phrased like the task generator phrases them."""
    low = text.lower()
    category = next(
        (c for c in sorted(CATEGORIES, key=len, reverse=True) if c.replace("_", " ") in low), None
    )
    count_match = re.search(r"\b(\d+) [a-z ]+? items\b", low)
    budget_match = re.search(r"budget of (\d+(?:\.\d+)?) cny", low)
    excluded_match = re.search(r"nothing made of ([a-z ]+?)\.", low)
    platform_match = re.search(r"only buy from ([a-z ]+?)\.", low)
    return ParsedRequest(
        category=category,
        count=int(count_match.group(1)) if count_match else 1,
        budget_cny=float(budget_match.group(1)) if budget_match else None,
        excluded_materials=tuple(
            m.strip().replace(" ", "_") for m in excluded_match.group(1).split(" or ")
        )
        if excluded_match
        else (),
        platforms=tuple(
            p for p in (x.strip() for x in platform_match.group(1).split(" or ")) if p in PLATFORMS
        )
        if platform_match
        else (),
        direct_shipping="direct shipping only" in low,
    )


@dataclass
class _Step:
    name: str
    args: dict[str, Any]
    result: ToolMessage | None


@dataclass
class _Transcript:
    request: str
    steps: list[_Step] = field(default_factory=list)
    lessons: str = ""
    change_approach: bool = False
    skills: list[str] = field(default_factory=list)
    """Offered skills without a workflow."""
    workflows: dict[str, list[str]] = field(default_factory=dict)
    """Offered workflow tools and their parameters."""


_OFFERED = re.compile(r"^- ([a-z0-9-]+): (.*)$", re.MULTILINE)
_WORKFLOW = re.compile(r"Workflow tool: (\w+)\(([^)]*)\)")


def _offered(t: _Transcript, text: str) -> None:
    """The skills section of the system prompt (names, workflow tools and parameters)."""
    section = text[text.index(SKILLS_HEADER + " (") :]
    for m in _OFFERED.finditer(section):
        flow = _WORKFLOW.search(m.group(2))
        if flow:
            t.workflows[flow.group(1)] = [p.strip() for p in flow.group(2).split(",") if p.strip()]
        else:
            t.skills.append(m.group(1))


def _expand(call: dict[str, Any], result: ToolMessage | None) -> list[_Step]:
    """A workflow call and the inner calls it reports, as steps (what it did, done)."""
    steps = [_Step(call["name"], dict(call["args"]), result)]
    try:
        report = json.loads(str(result.content)) if result is not None else {}
    except ValueError:
        report = {}
    for inner in report.get("calls", []) if isinstance(report, dict) else []:
        status = inner.get("status")
        text = inner.get("output", "") if status == "ok" else inner.get("error", "")
        if status == "skipped":
            text = f"{text} ({SKIPPED})"
        message = ToolMessage(
            content=str(text),
            tool_call_id=f"{call.get('id')}.{len(steps)}",
            status="success" if status == "ok" else "error",
        )
        steps.append(_Step(str(inner.get("tool")), dict(inner.get("args") or {}), message))
    return steps


def _read(messages: list[BaseMessage]) -> _Transcript:
    request = next((str(m.content) for m in messages if isinstance(m, HumanMessage)), "")
    results = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    t = _Transcript(request=request)
    last_ai = max((i for i, m in enumerate(messages) if isinstance(m, AIMessage)), default=-1)
    for i, m in enumerate(messages):
        if isinstance(m, AIMessage):
            for c in m.tool_calls:
                result = results.get(c.get("id") or "")
                if c["name"].startswith(WORKFLOW_PREFIX):
                    t.steps += _expand(dict(c), result)
                    continue
                t.steps.append(_Step(c["name"], dict(c["args"]), result))
                if c["name"] == LOAD_SKILL and result is not None and result.status != "error":
                    t.lessons += str(result.content).lower()  # a skill's instructions
        elif isinstance(m, SystemMessage):
            text = str(m.content)
            if LESSON_HEADER in text:
                t.lessons += text[text.index(LESSON_HEADER) :].lower()
            if SKILLS_HEADER + " (" in text:
                _offered(t, text)
            if i > last_ai and CHANGE_APPROACH in text.lower():
                t.change_approach = True
    return t


def _json(msg: ToolMessage | None) -> dict[str, Any]:
    if msg is None or msg.status == "error":
        return {}
    try:
        data = json.loads(str(msg.content))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class OfflineShopPolicy:
    """SIMULATED policy callable for :class:`~evoharness.sdk.testing.ScriptedChatModel`."""

    def __init__(
        self,
        *,
        seed: int = 0,
        mistakes: MistakeRates | None = None,
        lesson_effect: float = 0.2,
        loop_limit: int = 8,
    ) -> None:
        self.seed = seed
        self.mistakes = mistakes or MistakeRates()
        self.lesson_effect = lesson_effect
        self.loop_limit = loop_limit

    def makes(self, mistake: str, t: _Transcript) -> bool:
        """Whether this task's run makes ``mistake`` (seeded by task text and policy seed)."""
        rate = float(getattr(self.mistakes, mistake))
        if LESSON_KEYS[mistake] in t.lessons:
            rate *= self.lesson_effect
        digest = hashlib.sha256(f"{self.seed}|{mistake}|{t.request}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < rate

    def _use_skills(
        self, t: _Transcript, req: ParsedRequest, done: set[str]
    ) -> tuple[str, dict[str, Any]] | None:
        """The offered workflow to call (once), or the offered skill to load first."""
        assert req.category is not None
        slug = req.category.replace("-", "_")
        flows = sorted(t.workflows, key=lambda w: slug not in w)
        if flows:
            if flows[0] in done:
                return None
            excluded = [] if self.makes("ignore_excluded_material", t) else req.excluded_materials
            values: dict[str, Any] = {
                "request": t.request,
                "category": req.category,
                "query": req.category.replace("_", " "),
                "platforms": list(req.platforms or PLATFORMS),
                "exclude_materials": list(excluded),
                "excluded_materials": list(excluded),
                "direct_shipping_only": req.direct_shipping,
                "limit": 10,
                "count": req.count,
                "budget_cny": req.budget_cny,
            }
            params = t.workflows[flows[0]]
            return flows[0], {p: values[p] for p in params if p in values}
        skills = sorted(t.skills, key=lambda s: slug.replace("_", "-") not in s)
        loaded = {str(s.args.get("name")) for s in t.steps if s.name == LOAD_SKILL}
        if skills and skills[0] not in loaded:
            return LOAD_SKILL, {"name": skills[0]}
        return None

    def __call__(self, messages: list[BaseMessage]) -> AIMessage:
        t = _read(messages)
        n = len(t.steps)

        def call(name: str, **args: Any) -> AIMessage:
            return AIMessage(
                content="",
                tool_calls=[
                    {"name": name, "args": args, "id": f"call_{n + 1}", "type": "tool_call"}
                ],
            )

        done = {s.name for s in t.steps}
        if TERMINAL_TOOL in done:
            return AIMessage(content="I have already presented my picks above.")
        req = parse_request(t.request)
        if req.category is None:
            if "chat_fallback" in done:
                return AIMessage(
                    content=str(
                        t.steps[-1].result.content if t.steps[-1].result else "How can I help?"
                    )
                )
            return call("chat_fallback", message=t.request)
        if self.makes("hallucinated_tool", t) and HALLUCINATED_TOOL not in done:
            return call(HALLUCINATED_TOOL, query=req.category)
        skill_step = self._use_skills(t, req, done)
        if skill_step is not None:
            return call(skill_step[0], **skill_step[1])
        if "planner" not in done:
            return call("planner", request=t.request)
        if "category_insight" not in done:
            return call("category_insight", category=req.category)

        ignore_material = self.makes("ignore_excluded_material", t)
        excluded = [] if ignore_material else list(req.excluded_materials)
        candidates: dict[str, dict[str, Any]] = {}
        for platform in req.platforms or PLATFORMS:
            tries = [
                s for s in t.steps if s.name == "item_search" and s.args.get("platform") == platform
            ]
            search = {
                "platform": platform,
                "query": req.category.replace("_", " "),
                "category": req.category,
                "direct_shipping_only": req.direct_shipping,
                "exclude_materials": excluded,
                "limit": 10,
            }
            if not tries:
                return call("item_search", **search)
            last = tries[-1]
            if last.result is None or last.result.status == "error":
                circuit_open = last.result is not None and (
                    "circuit open" in str(last.result.content)
                    or SKIPPED in str(last.result.content)  # the skill says: go on without it
                )
                looping = (
                    self.makes("retry_failing_platform", t)
                    and not t.change_approach
                    and not circuit_open
                )
                if looping and len(tries) < self.loop_limit:
                    return call("item_search", **last.args)
                continue
            for row in _json(last.result).get("results", []):
                if (
                    row.get("platform", platform) == platform
                    and row.get("category") == req.category
                ):
                    candidates[row["item_id"]] = row

        pickers = [s for s in t.steps if s.name == "item_picker"]
        if not pickers and candidates:
            return call(
                "item_picker",
                item_ids=sorted(candidates),
                count=req.count,
                budget_cny=req.budget_cny,
                excluded_materials=excluded,
                direct_shipping_only=req.direct_shipping,
            )
        picks = _json(pickers[-1].result).get("picks", []) if pickers else []
        landed: dict[str, float] = {}
        for s in t.steps:
            if s.name == "shipping_calc":
                data = _json(s.result)
                if "landed_price_cny" in data:
                    landed[data["item_id"]] = float(data["landed_price_cny"])
        if not self.makes("skip_shipping_calc", t):
            for p in picks:
                if p["item_id"] not in landed and not any(
                    s.name == "shipping_calc" and s.args.get("item_id") == p["item_id"]
                    for s in t.steps
                ):
                    return call("shipping_calc", item_id=p["item_id"])
        final = [
            {
                "item_id": p["item_id"],
                "landed_price_cny": landed.get(p["item_id"], float(p["price_cny"])),
                "reason": f"rated {p['rating']}, {p['material'].replace('_', ' ')}",
            }
            for p in picks
        ]
        text = (
            f"Here are {len(final)} {req.category.replace('_', ' ')} pick(s) within "
            f"{req.budget_cny or 0:.0f} CNY."
            if final
            else "I could not find items that satisfy every constraint."
        )
        if self.makes("no_summary", t):
            listing = "; ".join(f"{p['item_id']} at {p['landed_price_cny']:.2f} CNY" for p in final)
            return AIMessage(content=f"{text} {listing}".strip())
        prefs = [f"avoid {m.replace('_', ' ')}" for m in req.excluded_materials]
        if req.direct_shipping:
            prefs.append("direct shipping")
        return call(TERMINAL_TOOL, picks=final, summary=text, preferences=prefs)
