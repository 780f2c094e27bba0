"""The shop world's LangChain tools, bound to one session's deterministic fault stream."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from typing import Any, Literal

from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field

from evoharness.examples.shop.catalogue import CATEGORIES, PLATFORMS, Catalogue, Item
from evoharness.examples.shop.faults import FaultConfig
from evoharness.examples.shop.rules import pick_items

Platform = Literal["amazon", "shopee", "aliexpress", "ebay"]
TERMINAL_TOOL = "shopping_summary"
TOOL_NAMES = (
    "planner",
    "category_insight",
    "item_search",
    "price_compare",
    "shipping_calc",
    "item_picker",
    TERMINAL_TOOL,
    "chat_fallback",
)


class PlatformUnavailableError(RuntimeError):
    """Simulated outage of a platform's search backend."""


class PlannerArgs(BaseModel):
    request: str = Field(description="The customer's request, verbatim")


class InsightArgs(BaseModel):
    category: str = Field(description="Product category, e.g. 'kitchen'")


class SearchArgs(BaseModel):
    platform: Platform = Field(description="Which marketplace to search")
    query: str = Field(description="Search words, e.g. 'kettle'")
    category: str | None = Field(None, description="Restrict to one category")
    max_price_cny: float | None = Field(None, gt=0, description="Maximum list price")
    direct_shipping_only: bool = Field(False, description="Only direct-shipping listings")
    exclude_materials: list[str] = Field(default_factory=list, description="Materials to skip")
    limit: int = Field(10, ge=1, le=50, description="Maximum listings to return")


class ItemIdsArgs(BaseModel):
    item_ids: list[str] = Field(min_length=1, description="Catalogue item ids")


class ShippingArgs(BaseModel):
    item_id: str = Field(description="Catalogue item id")


class PickerArgs(BaseModel):
    item_ids: list[str] = Field(min_length=1, description="Candidate item ids")
    count: int = Field(ge=1, le=10, description="How many items to pick")
    budget_cny: float | None = Field(None, gt=0, description="Total landed budget")
    excluded_materials: list[str] = Field(default_factory=list)
    direct_shipping_only: bool = False


class Pick(BaseModel):
    item_id: str
    landed_price_cny: float = Field(description="Price + shipping + duty, from shipping_calc")
    reason: str = ""


class SummaryArgs(BaseModel):
    picks: list[Pick] = Field(description="The final picks")
    summary: str = Field(description="Answer for the customer")
    preferences: list[str] = Field(default_factory=list, description="Learned preferences")


class FallbackArgs(BaseModel):
    message: str


def _listing(item: Item) -> dict[str, Any]:
    return {
        "item_id": item.item_id,
        "platform": item.platform,
        "title": item.title,
        "category": item.category,
        "material": item.material,
        "price_cny": item.price_cny,
        "rating": item.rating,
        "direct_shipping": item.direct_shipping,
        "in_stock": item.stock > 0,
    }


class ShopSession:
    """One session's view of the shop: the catalogue plus a seeded fault stream.

    Faults are drawn from a generator seeded by ``(seed, session_id)``, so a task replays
    identically whatever else runs concurrently.
    """

    def __init__(
        self, catalogue: Catalogue, *, faults: FaultConfig, seed: int, session_id: str
    ) -> None:
        self.catalogue = catalogue
        self.faults = faults
        self._rng = random.Random(f"{seed}:{session_id}")
        self.search_calls = 0

    # -- tool bodies -----------------------------------------------------------------------
    def planner(self, request: str) -> str:
        return (
            "Plan: 1) identify category, count, budget and exclusions in the request; "
            "2) category_insight for typical prices; 3) item_search on each allowed platform; "
            "4) item_picker with every constraint; 5) shipping_calc for each pick to get the "
            "landed price (price + shipping + duty); 6) shopping_summary with the picks."
        )

    def category_insight(self, category: str) -> str:
        items = [i for i in self.catalogue if i.category == category]
        if not items:
            return json.dumps(
                {"error": f"unknown category {category!r}", "categories": sorted(CATEGORIES)}
            )
        landed = [i.landed_price_cny for i in items]
        return json.dumps(
            {
                "category": category,
                "listings": len(items),
                "median_landed_price_cny": round(statistics.median(landed), 2),
                "materials": sorted({i.material for i in items}),
                "direct_shipping_share": round(
                    sum(i.direct_shipping for i in items) / len(items), 2
                ),
            }
        )

    def _search_fault(self, platform: str) -> tuple[float, str | None]:
        """Draw this call's simulated fault: (delay seconds, fault kind or None)."""
        f = self.faults.for_platform(platform)
        self.search_calls += 1
        roll = self._rng.random()
        if roll < f.failure_rate:
            return f.latency_s, "failure"
        if roll < f.failure_rate + f.timeout_rate:
            return f.latency_s + f.timeout_s, "timeout"
        if self._rng.random() < f.oversized_rate:
            return f.latency_s, "oversized"
        return f.latency_s, None

    def _search_result(self, args: SearchArgs, fault: str | None) -> str:
        if fault == "failure":
            raise PlatformUnavailableError(f"{args.platform} search backend unavailable (HTTP 503)")
        if fault == "timeout":
            raise TimeoutError(f"{args.platform} search timed out")
        words = {w for w in args.query.lower().replace("_", " ").split() if len(w) > 2}
        hits = [
            i
            for i in self.catalogue
            if i.platform == args.platform
            and (args.category is None or i.category == args.category)
            and (args.max_price_cny is None or i.price_cny <= args.max_price_cny)
            and (i.direct_shipping or not args.direct_shipping_only)
            and i.material not in args.exclude_materials
            and (
                args.category is not None
                or not words
                or words & set(f"{i.title} {i.category.replace('_', ' ')}".split())
            )
        ]
        hits.sort(key=lambda i: (-i.rating, i.price_cny, i.item_id))
        if fault == "oversized":
            filler = "Full listing details, seller history and reviews follow. " * 12
            bulky = [dict(_listing(i), description=filler) for i in self.catalogue]
            return json.dumps(
                {
                    "platform": args.platform,
                    "results": bulky[: self.faults.for_platform(args.platform).oversized_items],
                }
            )
        return json.dumps(
            {"platform": args.platform, "results": [_listing(i) for i in hits[: args.limit]]}
        )

    def item_search(self, **kwargs: Any) -> str:
        args = SearchArgs(**kwargs)
        delay, fault = self._search_fault(args.platform)
        if delay:
            time.sleep(delay)
        return self._search_result(args, fault)

    async def aitem_search(self, **kwargs: Any) -> str:
        args = SearchArgs(**kwargs)
        delay, fault = self._search_fault(args.platform)
        if delay:
            await asyncio.sleep(delay)
        return self._search_result(args, fault)

    def price_compare(self, item_ids: list[str]) -> str:
        found = [i for i in map(self.catalogue.get, item_ids) if i is not None]
        unknown = [x for x in item_ids if self.catalogue.get(x) is None]
        rows = sorted(found, key=lambda i: i.price_cny)
        return json.dumps(
            {
                "by_price": [
                    {
                        "item_id": i.item_id,
                        "platform": i.platform,
                        "price_cny": i.price_cny,
                        "rating": i.rating,
                    }
                    for i in rows
                ],
                "unknown_ids": unknown,
            }
        )

    def shipping_calc(self, item_id: str) -> str:
        item = self.catalogue.get(item_id)
        if item is None:
            return json.dumps({"error": f"unknown item id {item_id!r}"})
        return json.dumps(
            {
                "item_id": item.item_id,
                "price_cny": item.price_cny,
                "shipping_cny": item.shipping_cny,
                "duty_cny": item.duty_cny,
                "landed_price_cny": item.landed_price_cny,
            }
        )

    def item_picker(self, **kwargs: Any) -> str:
        args = PickerArgs(**kwargs)
        known = [i for i in map(self.catalogue.get, args.item_ids) if i is not None]
        picks = pick_items(
            known,
            count=args.count,
            budget_cny=args.budget_cny,
            excluded_materials=args.excluded_materials,
            direct_shipping_only=args.direct_shipping_only,
        )
        return json.dumps(
            {
                "picks": [_listing(i) for i in picks],
                "note": "prices are list prices; call shipping_calc for each pick's landed price",
                "shortfall": args.count - len(picks),
            }
        )

    def shopping_summary(
        self, picks: list[Pick | dict[str, Any]], summary: str, preferences: list[str] | None = None
    ) -> str:
        rows = [p if isinstance(p, Pick) else Pick.model_validate(p) for p in picks]
        lines = [summary.strip(), ""]
        lines += [
            f"- {p.item_id}: {p.landed_price_cny:.2f} CNY landed. {p.reason}".rstrip() for p in rows
        ]
        total = sum(p.landed_price_cny for p in rows)
        lines.append(f"Total landed: {total:.2f} CNY")
        if preferences:
            lines.append("Noted preferences: " + "; ".join(preferences))
        return "\n".join(lines)

    def chat_fallback(self, message: str) -> str:
        return (
            "I can help you shop on " + ", ".join(PLATFORMS) + ": tell me what you need, "
            "your budget, and anything to avoid."
        )

    # -- LangChain tools -------------------------------------------------------------------
    def tools(self) -> list[BaseTool]:
        """The eight shop tools as LangChain ``StructuredTool`` objects."""

        def make(name: str, args: type[BaseModel], doc: str, **extra: Any) -> BaseTool:
            return StructuredTool.from_function(
                func=getattr(self, name), name=name, description=doc, args_schema=args, **extra
            )

        return [
            make("planner", PlannerArgs, "Outline the steps to fulfil a shopping request."),
            make(
                "category_insight",
                InsightArgs,
                "Typical landed prices and materials of a category.",
            ),
            StructuredTool.from_function(
                func=self.item_search,
                coroutine=self.aitem_search,
                name="item_search",
                description="Search one platform's listings (list prices, no shipping/duty).",
                args_schema=SearchArgs,
            ),
            make("price_compare", ItemIdsArgs, "Compare list prices of several items."),
            make(
                "shipping_calc", ShippingArgs, "Shipping, import duty and landed price of an item."
            ),
            make("item_picker", PickerArgs, "Pick the best items satisfying the constraints."),
            make(
                TERMINAL_TOOL,
                SummaryArgs,
                "Finish: present the picks with landed prices to "
                "the customer. Call exactly once, last.",
                return_direct=True,
            ),
            make("chat_fallback", FallbackArgs, "Answer messages that are not shopping requests."),
        ]
