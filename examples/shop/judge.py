"""The shop's rule judge: the environment checker as rubric items (no model needed).

Maps the checker's failure types onto P0 red lines (budget blown, forbidden items, made-up
items) and P1 process items (required step skipped, no summary, unknown tool), and derives
a P2 "fit" score from the checker's own score. Every item carries the hint a lesson needs.
"""

from __future__ import annotations

from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.judge import ItemResult
from evoharness.evolve.judging.rubric import BASE_ITEMS, Rubric, RubricItem
from evoharness.examples.shop.catalogue import Catalogue, generate_catalogue
from evoharness.examples.shop.checker import check_calls
from evoharness.examples.shop.policy import parse_request
from evoharness.examples.shop.tasks import ShopTask, load_manifest

SHOP_ITEMS: tuple[RubricItem, ...] = (
    RubricItem(
        id="over_budget",
        priority="P0",
        description="Total landed price of the picks is within the budget",
        outcome="decides",
        avoid_hint="Check the total landed price against the budget before shopping_summary.",
    ),
    RubricItem(
        id="excluded_material",
        priority="P0",
        description="No pick is made of an excluded material",
        outcome="decides",
        avoid_hint="Pass the excluded_materials to item_search and item_picker.",
    ),
    RubricItem(
        id="wrong_platform",
        priority="P0",
        description="Picks come from allowed platforms",
        outcome="decides",
        avoid_hint="Search only the platforms the user allows.",
    ),
    RubricItem(
        id="not_direct_shipping",
        priority="P0",
        description="Picks ship directly when required",
        outcome="decides",
        avoid_hint="Set direct_shipping_only when the user asks for direct shipping.",
    ),
    RubricItem(
        id="wrong_category",
        priority="P0",
        description="Picks are in the requested category",
        outcome="decides",
        avoid_hint="Search the requested category.",
    ),
    RubricItem(
        id="out_of_stock",
        priority="P0",
        description="Picks are in stock",
        outcome="decides",
        avoid_hint="Pick only in-stock items.",
    ),
    RubricItem(
        id="wrong_landed_price",
        priority="P1",
        weight=0.35,
        description="Landed prices come from shipping_calc (required step)",
        outcome="decides",
        avoid_hint="Never skip shipping_calc: call it for every pick before "
        "shopping_summary (landed = price + shipping + duty).",
    ),
    RubricItem(
        id="no_summary",
        priority="P1",
        weight=0.5,
        description="The run ends with shopping_summary",
        outcome="decides",
        avoid_hint="Always finish by calling shopping_summary with the picks.",
    ),
    RubricItem(
        id="wrong_count",
        priority="P1",
        weight=0.2,
        description="As many picks as requested",
        outcome="decides",
        avoid_hint="Pick exactly the number of items the user asked for.",
    ),
    RubricItem(
        id="unknown_tool",
        priority="P1",
        weight=0.1,
        description="Only listed tools are called",
        avoid_hint="Only call listed tools; find_deals does not exist.",
    ),
    RubricItem(
        id="repeated_call",
        priority="P1",
        weight=0.2,
        description="No tool is called repeatedly with the same arguments",
        avoid_hint="Do not retry a failing platform; switch platform instead.",
    ),
)
_CHECKED = {i.id for i in SHOP_ITEMS} | {"fabricated_item"}


class ShopRules:
    """Rubric items and a rule check for shop episodes (tasks found by their request)."""

    def __init__(self, catalogue: Catalogue | None = None) -> None:
        manifest = load_manifest()
        self.catalogue = catalogue or generate_catalogue(manifest.catalogue_seed)
        self.tasks: dict[str, ShopTask] = {t.request: t for t in manifest.tasks}

    def items(self, query: str) -> list[RubricItem]:
        """Shop items for shop requests; nothing for other queries."""
        return list(SHOP_ITEMS) if query in self.tasks else []

    def check(self, episode: Episode, rubric: Rubric) -> list[ItemResult]:
        """Re-run the shop checker on the episode's recorded tool calls."""
        task = self.tasks.get(episode.query or "")
        if task is None:
            return []
        calls = [(c.name, c.args, not c.error) for c in episode.tool_calls]
        r = check_calls(
            task, calls, self.catalogue, error=episode.error if episode.status == "error" else None
        )
        failed = set(r.failures)
        if any(
            c.error and ("Unknown tool" in str(c.output) or "not a valid tool" in str(c.output))
            for c in episode.tool_calls
        ):
            failed.add("unknown_tool")
        results = [
            ItemResult(id=item.id, priority=item.priority, passed=item.id not in failed)
            for item in (rubric.item(i) for i in sorted(_CHECKED))
            if item is not None
        ]
        results.append(
            ItemResult(
                id="fit",
                priority="P2",
                score=round(1 + 4 * r.score, 3),
                comment=f"checker score {r.score:.2f}",
            )
        )
        return results

    @staticmethod
    def pattern(query: str) -> str:
        """The query pattern memory is keyed on: the product category."""
        return parse_request(query).category or "shopping"

    @staticmethod
    def hints() -> dict[str, str]:
        """Rubric item id -> what to do instead (imperative), shop items refining the base
        ones; these become the shop's lessons."""
        items = {i.id: i for i in (*BASE_ITEMS, *SHOP_ITEMS)}
        return {k: i.avoid_hint for k, i in items.items() if i.avoid_hint}
