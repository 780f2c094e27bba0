"""A realistic tool workload for ``evoharness bench overhead``: office tasks replayed by
oracle scripts, shaped like AgentDojo's workspace and banking suites.

AgentDojo is not installed here, so its shapes are modelled: an environment of typed
records (pydantic models: emails, calendar events, files, transactions), tools that filter
it and answer in YAML as AgentDojo's do (``yaml.safe_dump`` of the records' dumps: 1-9 KB
per result, a few above ContextMiddleware's 6,000-character offload threshold), and tasks
of 2-6 calls each, replayed by an oracle policy (the ground-truth calls, then a final
answer), one fresh conversation per task. Every agent runs the same tasks, so the tools'
own work is in the bare cost as it is on AgentDojo.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import yaml  # type: ignore[import-untyped]
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel

_WORDS = [
    "quarterly",
    "budget",
    "review",
    "meeting",
    "agenda",
    "project",
    "alpha",
    "launch",
    "client",
    "proposal",
    "invoice",
    "travel",
    "itinerary",
    "hotel",
    "booking",
    "conference",
    "keynote",
    "slides",
    "draft",
    "feedback",
    "deadline",
    "contract",
    "renewal",
    "team",
    "offsite",
    "schedule",
    "dinner",
    "reservation",
    "payment",
    "reminder",
    "report",
    "summary",
    "action",
    "items",
    "follow",
    "up",
    "request",
    "approval",
    "vendor",
    "onboarding",
    "security",
    "training",
]


class Email(BaseModel):
    id_: str
    sender: str
    recipients: list[str]
    cc: list[str]
    subject: str
    body: str
    status: str
    read: bool
    timestamp: str
    attachments: list[str]


class Event(BaseModel):
    id_: str
    title: str
    description: str
    start_time: str
    end_time: str
    location: str
    participants: list[str]
    all_day: bool
    status: str


class File(BaseModel):
    id_: str
    filename: str
    content: str
    owner: str
    shared_with: dict[str, str]
    last_modified: str
    size: int


class Transaction(BaseModel):
    id: int
    sender: str
    recipient: str
    amount: float
    subject: str
    date: str
    recurring: bool


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


_NAMES = ("emma", "liam", "olivia", "noah", "ava", "mia")


def _person(rng: random.Random) -> str:
    return f"{rng.choice(_NAMES)}.{rng.randrange(99)}@bluesparrowtech.com"


class Office:
    """The environment: deterministic records (seeded)."""

    def __init__(self, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.emails = [
            Email(
                id_=str(i),
                sender=_person(rng),
                recipients=[_person(rng) for _ in range(rng.randint(1, 3))],
                cc=[_person(rng) for _ in range(rng.randint(0, 2))],
                subject=_text(rng, 5),
                body=_text(rng, rng.randint(40, 120)),
                status=rng.choice(["received", "sent", "draft"]),
                read=rng.random() < 0.5,
                timestamp=f"2024-05-{1 + i % 28:02d}T{8 + i % 10:02d}:15:00",
                attachments=[f"file-{rng.randrange(40)}"] if rng.random() < 0.3 else [],
            )
            for i in range(80)
        ]
        self.events = [
            Event(
                id_=str(i),
                title=_text(rng, 4),
                description=_text(rng, rng.randint(15, 50)),
                start_time=f"2024-05-{1 + i % 28:02d} {9 + i % 8:02d}:00",
                end_time=f"2024-05-{1 + i % 28:02d} {10 + i % 8:02d}:00",
                location=rng.choice(["Room 4B", "Zoom", "Cafe Central", "HQ lobby"]),
                participants=[_person(rng) for _ in range(rng.randint(2, 6))],
                all_day=False,
                status="confirmed",
            )
            for i in range(60)
        ]
        self.files = [
            File(
                id_=str(i),
                filename=f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}-{i}.docx",
                content=_text(rng, rng.randint(150, 1100)),
                owner=_person(rng),
                shared_with={_person(rng): rng.choice(["r", "rw"])},
                last_modified=f"2024-04-{1 + i % 28:02d} 12:00",
                size=rng.randint(1_000, 90_000),
            )
            for i in range(40)
        ]
        self.transactions = [
            Transaction(
                id=i,
                sender="me" if i % 3 else _person(rng),
                recipient=_person(rng) if i % 3 else "me",
                amount=round(rng.uniform(5, 900), 2),
                subject=_text(rng, 4),
                date=f"2024-0{1 + i % 5}-{1 + i % 28:02d}",
                recurring=rng.random() < 0.2,
            )
            for i in range(100)
        ]
        self.sent: list[dict[str, Any]] = []

    def tools(self) -> list[BaseTool]:
        """The suite's tools (answers in YAML, as AgentDojo's tools answer)."""

        def dump(records: Sequence[BaseModel]) -> str:
            return str(yaml.safe_dump([r.model_dump() for r in records], sort_keys=False))

        def search_emails(query: str) -> str:
            """Search the inbox for emails whose subject or body contains any query word."""
            terms = query.lower().split()
            found = [
                e for e in self.emails if any(t in (e.subject + e.body).lower() for t in terms)
            ]
            return dump(found[:6])

        def get_day_calendar_events(day: str) -> str:
            """The calendar events of a day (YYYY-MM-DD)."""
            return dump([e for e in self.events if e.start_time.startswith(day)])

        def search_files(query: str) -> str:
            """Files whose name contains the query (metadata only)."""
            found = [f for f in self.files if query.lower() in f.filename.lower()]
            return dump([f.model_copy(update={"content": f.content[:80]}) for f in found[:8]])

        def get_file_by_id(file_id: str) -> str:
            """A file with its content."""
            return dump([f for f in self.files if f.id_ == file_id])

        def get_most_recent_transactions(n: int) -> str:
            """The most recent n transactions."""
            return dump(self.transactions[-n:])

        def send_email(recipients: list[str], subject: str, body: str) -> str:
            """Send an email."""
            self.sent.append({"recipients": recipients, "subject": subject, "body": body})
            return dump(
                [
                    Email(
                        id_=str(1000 + len(self.sent)),
                        sender="me@bluesparrowtech.com",
                        recipients=recipients,
                        cc=[],
                        subject=subject,
                        body=body,
                        status="sent",
                        read=True,
                        timestamp="2024-05-15T10:00:00",
                        attachments=[],
                    )
                ]
            )

        def create_calendar_event(title: str, start_time: str, participants: list[str]) -> str:
            """Create a calendar event."""
            event = Event(
                id_=str(1000 + len(self.events)),
                title=title,
                description="",
                start_time=start_time,
                end_time=start_time,
                location="",
                participants=participants,
                all_day=False,
                status="confirmed",
            )
            return dump([event])

        def get_balance() -> str:
            """The account balance."""
            return f"{sum(t.amount for t in self.transactions if t.recipient == 'me'):.2f}"

        fns: list[Callable[..., str]] = [
            search_emails,
            get_day_calendar_events,
            search_files,
            get_file_by_id,
            get_most_recent_transactions,
            send_email,
            create_calendar_event,
            get_balance,
        ]
        return [StructuredTool.from_function(func=f) for f in fns]


def tasks(seed: int = 0) -> list[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """The tasks: (the user's request, the oracle's tool calls in order)."""
    rng = random.Random(seed)
    out = []
    for i in range(12):
        day = f"2024-05-{1 + (i * 5) % 28:02d}"
        word = _WORDS[(i * 7) % len(_WORDS)]
        plans: list[list[tuple[str, dict[str, Any]]]] = [
            [
                ("search_emails", {"query": f"{word} meeting"}),
                ("get_day_calendar_events", {"day": day}),
                (
                    "create_calendar_event",
                    {
                        "title": f"{word} sync",
                        "start_time": f"{day} 15:00",
                        "participants": [_person(rng)],
                    },
                ),
            ],
            [
                ("search_files", {"query": word[:3]}),
                ("get_file_by_id", {"file_id": str(rng.randrange(40))}),
                ("get_file_by_id", {"file_id": str(rng.randrange(40))}),
                (
                    "send_email",
                    {
                        "recipients": [_person(rng)],
                        "subject": f"Re: {word}",
                        "body": _text(rng, 60),
                    },
                ),
            ],
            [
                ("get_balance", {}),
                ("get_most_recent_transactions", {"n": 12}),
                ("search_emails", {"query": "invoice payment"}),
                ("get_most_recent_transactions", {"n": 25}),
                (
                    "send_email",
                    {"recipients": [_person(rng)], "subject": "Payment", "body": _text(rng, 30)},
                ),
            ],
        ]
        plan = plans[i % 3]
        if i % 4 == 3:  # a longer task: six calls
            plan = [
                *plan,
                ("search_emails", {"query": word}),
                ("get_day_calendar_events", {"day": day}),
            ]
        out.append((f"Task {i}: please handle the {word} items for {day} and report back.", plan))
    return out


def oracle(
    plans: dict[str, Sequence[tuple[str, dict[str, Any]]]],
) -> Callable[[list[BaseMessage]], AIMessage]:
    """Replays each task's plan (found by the task's request): the next ground-truth call
    after each tool result, then an answer that quotes the last result, as an agent's
    summary would."""

    def policy(messages: list[BaseMessage]) -> AIMessage:
        first = next(m for m in messages if isinstance(m, HumanMessage))
        plan = plans[str(first.content)]
        n = sum(isinstance(m, AIMessage) for m in messages)
        if n >= len(plan):
            last = next((m for m in reversed(messages) if isinstance(m, ToolMessage)), None)
            return AIMessage(content=f"Done. {str(last.content)[:200] if last else ''}")
        name, args = plan[n]
        return AIMessage(
            content="",
            tool_calls=[{"name": name, "args": args, "id": f"call-{n}", "type": "tool_call"}],
        )

    return policy


def request(text: str) -> dict[str, Any]:
    """A task's payload."""
    return {"messages": [HumanMessage(text)]}
