"""Context engineering settings for the shop, and a SIMULATED summariser for offline runs."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage

from evoharness.harness.context import ContextConfig, ProjectionRule
from evoharness.sdk.testing import ScriptedChatModel

SEARCH_FIELDS = [
    "item_id",
    "platform",
    "category",
    "material",
    "price_cny",
    "rating",
    "direct_shipping",
    "in_stock",
]


def shop_context_config() -> ContextConfig:
    """Search pages keep only the fields a shopper compares, at most 20 listings."""
    return ContextConfig(
        projections=[ProjectionRule(tool="item_search", fields=SEARCH_FIELDS, top_n=12)]
    )


def _summarise(messages: list[BaseMessage]) -> AIMessage:
    transcript = str(messages[-1].content) if messages else ""
    calls = [line for line in transcript.splitlines() if line.startswith("AI called ")]
    summary: dict[str, Any] = {
        "user_need": "find the requested items within the stated constraints",
        "searched": [c[len("AI called ") :][:80] for c in calls][-8:],
        "current_step": "comparing candidates",
        "next_step": "pick, price and summarise",
    }
    return AIMessage(content=json.dumps(summary))


def offline_summarizer() -> BaseChatModel:
    """A SIMULATED summariser: lists the searches, repeats no constraint (those stay in the
    task state verbatim). For demos and tests only."""
    return ScriptedChatModel(policy=_summarise, model_name="offline-summariser (simulated)")
