"""Constraint rules of the shop world, shared by the tools, the task generator and the checker."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from evoharness.examples.shop.catalogue import Item


class HardConstraints(BaseModel):
    """The constraints a run must satisfy; the checker enforces every one of them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    category: str
    count: int = Field(ge=1)
    budget_cny: float = Field(gt=0, description="Maximum total landed price of all picks")
    excluded_materials: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    direct_shipping: bool = False


def item_violations(item: Item, c: HardConstraints) -> list[str]:
    """Names of the per-item constraints ``item`` breaks (empty when it satisfies all)."""
    broken: list[str] = []
    if item.category != c.category:
        broken.append("wrong_category")
    if item.material in c.excluded_materials:
        broken.append("excluded_material")
    if c.platforms and item.platform not in c.platforms:
        broken.append("wrong_platform")
    if c.direct_shipping and not item.direct_shipping:
        broken.append("not_direct_shipping")
    if item.stock <= 0:
        broken.append("out_of_stock")
    return broken


def pick_items(
    candidates: Iterable[Item],
    *,
    count: int,
    budget_cny: float | None,
    excluded_materials: Sequence[str] = (),
    direct_shipping_only: bool = False,
) -> list[Item]:
    """Choose up to ``count`` in-stock items, best rated first, within a total landed budget.

    Greedy by (rating desc, landed price asc), accepting an item only when the remaining slots
    can still be filled by the cheapest remaining candidates within the budget.
    """
    pool = sorted(
        {
            i.item_id: i
            for i in candidates
            if i.stock > 0
            and i.material not in excluded_materials
            and (i.direct_shipping or not direct_shipping_only)
        }.values(),
        key=lambda i: (-i.rating, i.landed_price_cny, i.item_id),
    )
    chosen: list[Item] = []
    total = 0.0
    for item in pool:
        if len(chosen) == count:
            break
        rest = sorted(j.landed_price_cny for j in pool if j is not item and j not in chosen)[
            : count - len(chosen) - 1
        ]
        if budget_cny is None or total + item.landed_price_cny + sum(rest) <= budget_cny + 1e-9:
            chosen.append(item)
            total += item.landed_price_cny
    return chosen
