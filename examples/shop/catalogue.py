"""The seeded product catalogue of the shop world.

Everything is generated from a seed with :class:`random.Random`, so the same seed always gives
the same catalogue on every machine; :func:`catalogue_hash` pins it in the task manifest.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from functools import cache

PLATFORMS: tuple[str, ...] = ("amazon", "shopee", "aliexpress", "ebay")

# category -> (nouns, materials, price range in CNY)
CATEGORIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[float, float]]] = {
    "electronics": (
        ("earbuds", "charger", "speaker", "keyboard", "mouse"),
        ("plastic", "aluminium", "silicone", "glass"),
        (60, 900),
    ),
    "kitchen": (
        ("knife", "pan", "kettle", "cutting board", "mug"),
        ("stainless_steel", "plastic", "bamboo", "ceramic", "silicone"),
        (25, 600),
    ),
    "apparel": (
        ("t-shirt", "jacket", "scarf", "hoodie", "dress"),
        ("cotton", "polyester", "wool", "linen", "silk"),
        (40, 800),
    ),
    "footwear": (
        ("sneakers", "boots", "sandals", "slippers", "loafers"),
        ("leather", "rubber", "nylon", "cotton", "polyester"),
        (60, 1200),
    ),
    "toys": (
        ("puzzle", "robot kit", "plush", "building blocks", "kite"),
        ("plastic", "wood", "cotton", "paper", "polyester"),
        (20, 500),
    ),
    "beauty": (
        ("serum", "brush set", "hair dryer", "mirror", "lip balm"),
        ("plastic", "glass", "bamboo", "aluminium", "silicone"),
        (20, 700),
    ),
    "home_decor": (
        ("lamp", "vase", "cushion", "rug", "wall clock"),
        ("ceramic", "glass", "cotton", "wood", "wool"),
        (30, 900),
    ),
    "sports": (
        ("yoga mat", "dumbbell", "water bottle", "racket", "backpack"),
        ("rubber", "nylon", "stainless_steel", "aluminium", "polyester"),
        (30, 1000),
    ),
    "books": (
        ("novel", "cookbook", "atlas", "notebook set", "comic"),
        ("paper", "leather", "cotton"),
        (15, 300),
    ),
    "jewelry": (
        ("necklace", "ring", "bracelet", "earrings", "watch"),
        ("silver", "leather", "stainless_steel", "glass", "wood"),
        (40, 1500),
    ),
    "pet_supplies": (
        ("leash", "pet bed", "feeder", "chew toy", "carrier"),
        ("nylon", "cotton", "plastic", "rubber", "stainless_steel"),
        (20, 600),
    ),
    "stationery": (
        ("fountain pen", "planner", "desk organizer", "pencil case", "marker set"),
        ("plastic", "leather", "wood", "aluminium", "paper"),
        (10, 400),
    ),
}

ADJECTIVES = (
    "classic",
    "compact",
    "premium",
    "eco",
    "travel",
    "deluxe",
    "minimal",
    "smart",
    "vintage",
    "pro",
    "soft",
    "sturdy",
)

# platform -> (id prefix, price factor, shipping range, duty range, direct-shipping probability)
PLATFORM_PROFILES: dict[str, tuple[str, float, tuple[float, float], tuple[float, float], float]] = {
    "amazon": ("AMZ", 1.15, (15.0, 60.0), (0.05, 0.15), 0.8),
    "shopee": ("SHP", 0.85, (8.0, 35.0), (0.0, 0.10), 0.4),
    "aliexpress": ("ALX", 0.70, (5.0, 45.0), (0.05, 0.20), 0.3),
    "ebay": ("EBY", 1.00, (20.0, 80.0), (0.05, 0.18), 0.6),
}

ITEMS_PER_PLATFORM = 120
DEFAULT_SEED = 7


@dataclass(frozen=True, slots=True)
class Item:
    """One product listing. Prices are in CNY."""

    item_id: str
    platform: str
    title: str
    category: str
    material: str
    price_cny: float
    shipping_cny: float
    duty_rate: float
    rating: float
    direct_shipping: bool
    stock: int

    @property
    def duty_cny(self) -> float:
        """Import duty charged on the list price."""
        return round(self.price_cny * self.duty_rate, 2)

    @property
    def landed_price_cny(self) -> float:
        """What the buyer really pays: price + shipping + duty."""
        return round(self.price_cny + self.shipping_cny + self.duty_cny, 2)

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready dict of the stored fields."""
        return asdict(self)


class Catalogue:
    """An indexed, immutable set of items."""

    def __init__(self, items: Iterable[Item], *, seed: int) -> None:
        self.seed = seed
        self.items: tuple[Item, ...] = tuple(items)
        self._by_id = {item.item_id: item for item in self.items}

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def get(self, item_id: str) -> Item | None:
        """The item with ``item_id``, or ``None`` when no such item exists."""
        return self._by_id.get(item_id)

    def content_hash(self) -> str:
        """SHA-256 of the canonical JSON of every item."""
        return catalogue_hash(self.items)


def catalogue_hash(items: Iterable[Item]) -> str:
    """SHA-256 over the canonical JSON form of ``items``."""
    blob = json.dumps([i.to_dict() for i in items], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


@cache
def generate_catalogue(seed: int = DEFAULT_SEED) -> Catalogue:
    """Generate the catalogue for ``seed`` (cached: catalogues are immutable)."""
    rng = random.Random(seed)
    categories = sorted(CATEGORIES)
    items: list[Item] = []
    for platform in PLATFORMS:
        prefix, factor, ship_range, duty_range, direct_p = PLATFORM_PROFILES[platform]
        for n in range(ITEMS_PER_PLATFORM):
            category = categories[n % len(categories)]
            nouns, materials, (low, high) = CATEGORIES[category]
            material = rng.choice(materials)
            noun = rng.choice(nouns)
            title = f"{rng.choice(ADJECTIVES)} {material.replace('_', ' ')} {noun}"
            items.append(
                Item(
                    item_id=f"{prefix}-{n + 1:04d}",
                    platform=platform,
                    title=title,
                    category=category,
                    material=material,
                    price_cny=round(rng.uniform(low, high) * factor, 2),
                    shipping_cny=round(rng.uniform(*ship_range), 2),
                    duty_rate=round(rng.uniform(*duty_range), 3),
                    rating=round(rng.uniform(3.0, 5.0), 1),
                    direct_shipping=rng.random() < direct_p,
                    stock=0 if rng.random() < 0.06 else rng.randint(1, 60),
                )
            )
    return Catalogue(items, seed=seed)
