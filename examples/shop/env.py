"""The shop environment as the runner sees it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool

from evoharness.examples.shop.catalogue import Catalogue, generate_catalogue
from evoharness.examples.shop.checker import check_run
from evoharness.examples.shop.context import offline_summarizer, shop_context_config
from evoharness.examples.shop.faults import FaultConfig
from evoharness.examples.shop.policy import MistakeRates, OfflineShopPolicy
from evoharness.examples.shop.tasks import ShopTask, load_manifest
from evoharness.examples.shop.tools import TERMINAL_TOOL, ShopSession
from evoharness.harness import (
    BreakerBackend,
    BreakerConfig,
    ConfigError,
    GuardRuleSet,
    HarnessConfig,
    ReferenceProvider,
    default_middleware,
    key_by_arg,
)
from evoharness.sdk.environment import Outcome, TaskSpec
from evoharness.sdk.testing import ScriptedChatModel

SYSTEM_PROMPT = """You are Globex, a cross-border shopping assistant.
Tools: planner, category_insight, item_search (one platform per call), price_compare,
shipping_calc, item_picker, shopping_summary, chat_fallback.
Rules:
- Respect every constraint in the customer's request: budget (total landed price),
  excluded materials, allowed platforms, direct shipping, number of items.
- The landed price is price + shipping + import duty; get it from shipping_calc.
- Never invent item ids or prices; only recommend items returned by the tools.
- Finish by calling shopping_summary exactly once with your picks."""


class ShopEnvironment:
    """Cross-border shopping: 480 seeded listings, 8 tools, 360 frozen tasks.

    Args:
        faults: ``"demo"`` (default: shopee down, aliexpress timeouts, ebay bulky pages),
            ``"none"``, or a :class:`FaultConfig`.
        mistakes: Mistake rates of the SIMULATED offline policy.
        seed: Seeds the fault streams and the offline policy.
        breaker_backend: Share breaker state across sessions (e.g. Redis); by default each
            session has its own in-process breakers.
        references: Learned references injected at session start (evolve's memory).
        guard_rules_path: Output-guard rule file.
        guard_rules: Returns the current output-guard rules, e.g. the registry's active
            version (``evoharness.sdk.registry.active_guard_rules``); replaces the file.
        context: Turn on context engineering (search-page projection, offload, summaries
            with a SIMULATED summariser).
    """

    name = "shop"

    def __init__(
        self,
        *,
        faults: str | FaultConfig = "demo",
        mistakes: MistakeRates | None = None,
        seed: int = 0,
        breaker_backend: BreakerBackend | None = None,
        references: ReferenceProvider | None = None,
        guard_rules_path: Path | None = None,
        guard_rules: Callable[[], GuardRuleSet] | None = None,
        context: bool = False,
    ) -> None:
        if isinstance(faults, str):
            presets = {"demo": FaultConfig.demo, "none": FaultConfig.none}
            if faults not in presets:
                raise ConfigError(
                    f"unknown fault preset {faults!r}; choose demo or none", field="faults"
                )
            faults = presets[faults]()
        self.faults = faults
        self.mistakes = mistakes or MistakeRates()
        self.seed = seed
        self.breaker_backend = breaker_backend
        self.references = references
        self.guard_rules_path = guard_rules_path
        self.guard_rules = guard_rules
        self.context = context
        self.manifest = load_manifest()
        self.catalogue: Catalogue = generate_catalogue(self.manifest.catalogue_seed)

    def tasks(self, split: str) -> list[ShopTask]:
        return self.manifest.split(split)

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def _task(self, task: TaskSpec) -> ShopTask:
        if not isinstance(task, ShopTask):
            raise ConfigError(f"expected a ShopTask, got {type(task).__name__}")
        return task

    def tools_for(self, task: TaskSpec) -> list[BaseTool]:
        session = ShopSession(
            self.catalogue, faults=self.faults, seed=self.seed, session_id=task.task_id
        )
        return session.tools()

    def check(self, task: TaskSpec, messages: Sequence[BaseMessage], error: str | None) -> Outcome:
        r = check_run(self._task(task), messages, self.catalogue, error=error)
        return Outcome(
            success=r.success,
            score=r.score,
            failures=r.failures,
            components={
                "constraint_satisfaction": r.constraint_satisfaction,
                "landed_price_correct": r.landed_price_correct,
                "efficiency": r.efficiency,
                "fabricated_items": float(r.fabricated_items),
            },
        )

    def offline_model(self) -> BaseChatModel:
        policy = OfflineShopPolicy(seed=self.seed, mistakes=self.mistakes)
        return ScriptedChatModel(policy=policy, model_name="offline-shop-policy (simulated)")

    def harness_middleware(self) -> list[AgentMiddleware[Any, Any, Any]]:
        """The default harness, tuned for the shop: one breaker per search platform."""
        config = HarnessConfig(
            breaker=BreakerConfig(
                minimum_calls=2, window_size=20, failure_rate_threshold=0.5, open_duration_s=60
            ),
            breaker_key=key_by_arg("platform", tools={"item_search"}),
            terminal_tool=TERMINAL_TOOL,
            guard_rules_path=self.guard_rules_path,
            guard_rules_provider=self.guard_rules,
            context=shop_context_config() if self.context else None,
        )
        return default_middleware(
            config,
            breaker_backend=self.breaker_backend,
            references=self.references,
            summarizer=offline_summarizer() if self.context else None,
        )
