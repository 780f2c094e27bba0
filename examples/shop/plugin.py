"""The shop as an evolve environment plugin (registered like any third-party environment).

``pyproject.toml`` registers :data:`environment` in the ``evoharness.environments``
entry-point group as ``shop``, so ``evoharness evolve cycle --env shop`` and
``evoharness run --env shop`` find it; ``--env evoharness.examples.shop.plugin:environment``
works without the entry point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from evoharness.evolve.environment import ScoreEvidence
from evoharness.evolve.episodes.traces import Episode
from evoharness.evolve.judging.judge import RuleCheck
from evoharness.evolve.judging.rubric import RubricItem
from evoharness.examples.shop.env import ShopEnvironment
from evoharness.examples.shop.judge import ShopRules


class ShopPlugin:
    """Checker (the shop checker re-run on recorded tool calls), rubric items, category
    case keys and imperative lesson hints; ``runtime()`` builds a :class:`ShopEnvironment`."""

    name = "shop"
    version = "2"

    @cached_property
    def rules(self) -> ShopRules:
        """The shop's rule judge (catalogue and task manifest loaded on first use)."""
        return ShopRules()

    def runtime(self, **options: Any) -> ShopEnvironment:
        return ShopEnvironment(**options)

    def checks(self) -> Sequence[RuleCheck]:
        return [self.rules.check]

    def rubric_items(self, query: str) -> Sequence[RubricItem]:
        return self.rules.items(query)

    def case_key(self, query: str, metadata: Mapping[str, Any]) -> str:
        return self.rules.pattern(query)

    def lesson_hints(self) -> Mapping[str, str]:
        return self.rules.hints()

    def score_evidence(self) -> Sequence[ScoreEvidence]:
        return ()  # the checker already decides; env_success would only repeat it

    def owns(self, episode: Episode) -> bool:
        return "shop" in episode.tags or (episode.query or "") in self.rules.tasks


environment = ShopPlugin()
"""The registered plugin object."""
