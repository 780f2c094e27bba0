"""The frozen shop task set: generation, the versioned manifest and loading.

The manifest (``data/tasks_v1.json``) is generated once by :func:`build_manifest`, committed,
and verified on load by its content hash; a test regenerates it and checks it is identical.
"""

from __future__ import annotations

import hashlib
import json
import random
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from evoharness.examples.shop.catalogue import (
    CATEGORIES,
    DEFAULT_SEED,
    PLATFORMS,
    Catalogue,
    generate_catalogue,
)
from evoharness.examples.shop.rules import HardConstraints, item_violations, pick_items
from evoharness.harness import ConfigError

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")
MANIFEST_VERSION = "1"
MANIFEST_FILE = f"tasks_v{MANIFEST_VERSION}.json"
TASKS_SEED = 20261130
SPLIT_SIZES: dict[Split, int] = {"train": 240, "val": 60, "test": 60}


class ShopTask(BaseModel):
    """One shopping request with its hidden hard constraints."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    split: Split
    request: str
    constraints: HardConstraints


class TaskManifest(BaseModel):
    """A versioned, content-hashed task set bound to one catalogue."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    catalogue_seed: int
    catalogue_hash: str
    content_hash: str
    tasks: tuple[ShopTask, ...]

    def split(self, name: str) -> list[ShopTask]:
        """Tasks of one split; raises :class:`ConfigError` for an unknown split name."""
        if name not in SPLITS:
            raise ConfigError(f"unknown split {name!r}; choose one of {', '.join(SPLITS)}")
        return [t for t in self.tasks if t.split == name]


def tasks_hash(tasks: tuple[ShopTask, ...] | list[ShopTask]) -> str:
    """SHA-256 over the canonical JSON of ``tasks``."""
    blob = json.dumps([t.model_dump(mode="json") for t in tasks], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def render_request(c: HardConstraints, rng: random.Random) -> str:
    """Phrase the constraints the way a customer would."""
    noun = c.category.replace("_", " ")
    article = "an" if noun[0] in "aeiou" else "a"
    what = f"{article} {noun} item" if c.count == 1 else f"{c.count} {noun} items"
    opener = rng.choice(("I'm looking for", "Please find me", "Can you help me buy", "I need"))
    parts = [
        f"{opener} {what} with a total budget of {c.budget_cny:.0f} CNY including "
        "shipping and duty."
    ]
    if c.excluded_materials:
        mats = " or ".join(m.replace("_", " ") for m in c.excluded_materials)
        parts.append(f"Nothing made of {mats}.")
    if c.platforms:
        parts.append(f"Only buy from {' or '.join(c.platforms)}.")
    if c.direct_shipping:
        parts.append("Direct shipping only.")
    return " ".join(parts)


def _feasible(c: HardConstraints, catalogue: Catalogue) -> bool:
    ok = [i for i in catalogue if not item_violations(i, c)]
    picks = pick_items(ok, count=c.count, budget_cny=c.budget_cny)
    return len(picks) == c.count


def generate_tasks(seed: int = TASKS_SEED, catalogue: Catalogue | None = None) -> list[ShopTask]:
    """Generate the feasible task set deterministically from ``seed``."""
    catalogue = catalogue or generate_catalogue(DEFAULT_SEED)
    rng = random.Random(seed)
    tasks: list[ShopTask] = []
    categories = sorted(CATEGORIES)
    for split, size in SPLIT_SIZES.items():
        made = 0
        while made < size:
            category = rng.choice(categories)
            materials = CATEGORIES[category][1]
            count = rng.choices((1, 2, 3), weights=(5, 3, 2))[0]
            n_excluded = rng.choices((0, 1, 2), weights=(3, 4, 2))[0]
            n_platforms = rng.choices((0, 1, 2, 3), weights=(4, 2, 3, 2))[0]
            base = HardConstraints(
                category=category,
                count=count,
                budget_cny=1e9,
                excluded_materials=tuple(sorted(rng.sample(materials, n_excluded))),
                platforms=tuple(p for p in PLATFORMS if p in rng.sample(PLATFORMS, n_platforms)),
                direct_shipping=rng.random() < 0.3,
            )
            ok = sorted(i.landed_price_cny for i in catalogue if not item_violations(i, base))
            if len(ok) < count:
                continue
            budget = round(sum(ok[:count]) * rng.uniform(1.2, 1.9) / 10) * 10
            c = base.model_copy(update={"budget_cny": float(budget)})
            if not _feasible(c, catalogue):
                continue
            made += 1
            tasks.append(
                ShopTask(
                    task_id=f"shop-{split}-{made:03d}",
                    split=split,
                    request=render_request(c, rng),
                    constraints=c,
                )
            )
    return tasks


def build_manifest(seed: int = TASKS_SEED) -> TaskManifest:
    """Build the manifest for the current generator (used to write and to verify the file)."""
    catalogue = generate_catalogue(DEFAULT_SEED)
    tasks = tuple(generate_tasks(seed, catalogue))
    return TaskManifest(
        version=MANIFEST_VERSION,
        catalogue_seed=DEFAULT_SEED,
        catalogue_hash=catalogue.content_hash(),
        content_hash=tasks_hash(tasks),
        tasks=tasks,
    )


def write_manifest(path: Path) -> TaskManifest:
    """Write a freshly built manifest to ``path``."""
    manifest = build_manifest()
    path.write_text(json.dumps(manifest.model_dump(mode="json"), indent=1, sort_keys=True) + "\n")
    return manifest


@cache
def load_manifest() -> TaskManifest:
    """Load the committed manifest and verify both content hashes.

    Raises:
        ConfigError: The file was edited by hand or the catalogue generator changed.
    """
    text = (
        resources.files("evoharness.examples.shop")
        .joinpath("data")
        .joinpath(MANIFEST_FILE)
        .read_text()
    )
    manifest = TaskManifest.model_validate_json(text)
    if tasks_hash(manifest.tasks) != manifest.content_hash:
        raise ConfigError(
            f"{MANIFEST_FILE}: content hash mismatch; the task file was modified. "
            "Regenerate it with `python -m evoharness.examples.shop.tasks` and bump the version."
        )
    catalogue = generate_catalogue(manifest.catalogue_seed)
    if catalogue.content_hash() != manifest.catalogue_hash:
        raise ConfigError(
            f"{MANIFEST_FILE}: the catalogue for seed {manifest.catalogue_seed} no longer matches "
            "the manifest; the catalogue generator changed. Bump the manifest version."
        )
    return manifest


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    target = Path(__file__).parent / "data" / MANIFEST_FILE
    m = write_manifest(target)
    print(f"wrote {len(m.tasks)} tasks to {target} (hash {m.content_hash[:12]})")
