"""Memory proven by replay is served as production serves it: with the environment's case
key, so a lesson learned for a pattern reaches that pattern's sessions even when the
request shares none of its words (before, the replay ranked by words alone and served
nothing: both arms of the gate were the same agent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage

from evoharness.evolve.promotion import fixed_source
from evoharness.sdk import create_evo_agent
from evoharness.sdk.memory import MEMORY, MemoryEntry, MemoryStore
from evoharness.sdk.registry import open_registry
from evoharness.sdk.testing import ScriptedChatModel

LESSON = MemoryEntry(
    kind="lesson",
    summary="Always finish by calling shopping_summary with the picks.",
    patterns=["kitchen"],
    confidence=0.7,
)
REQUEST = "Please find me a kettle with a total budget of 90 CNY. Direct shipping only."


def system_seen(source: Any) -> str:
    """The system message the model got in one session served by ``source``."""
    seen: list[BaseMessage] = []
    model = ScriptedChatModel(policy=lambda messages: seen.extend(messages[:1]) or "done")
    create_evo_agent(model, system_prompt="You shop.", artifacts=[source]).invoke(REQUEST)
    assert isinstance(seen[0], SystemMessage)
    return str(seen[0].content)


def test_a_replayed_snapshot_serves_its_patterns_lessons_under_the_case_key(
    tmp_path: Path,
) -> None:
    registry = open_registry(tmp_path / "registry.db")
    memory = MemoryStore(tmp_path / "memory.db", registry=registry, name="shop")
    version = memory.replace({LESSON.id: LESSON})
    memory.close()

    with_key = fixed_source(registry, MEMORY, "shop", version, case_key=lambda q: "kitchen")
    assert LESSON.summary in system_seen(with_key)
    other = fixed_source(registry, MEMORY, "shop", version, case_key=lambda q: "toys")
    assert LESSON.summary not in system_seen(other)  # another pattern's session: not served
    # what the replay did before: words alone, and the request shares none of the lesson's
    assert LESSON.summary not in system_seen(fixed_source(registry, MEMORY, "shop", version))
    registry.close()
