"""Prompt versions: structured templates, section-aware diffs, registry and Langfuse backends.

>>> from evoharness.sdk.prompts import PromptTemplate, RegistryPromptStore, Section
>>> from evoharness.sdk.registry import open_registry
>>> store = RegistryPromptStore(open_registry("sqlite://"))
>>> v1 = store.create("shop", PromptTemplate(sections=[
...     Section(name="role", kind="role", text="You help people shop."),
...     Section(name="rules", kind="constraints", text="Never exceed the budget.", protected=True),
... ]))
>>> store.promote("shop", v1.version)
>>> store.get("shop").render()
'You help people shop.\\n\\nNever exceed the budget.'

See ``docs/prompts.md``.
"""

from evoharness.sdk.prompts.diff import PromptDiff, SectionChange, diff_templates
from evoharness.sdk.prompts.langfuse_store import LangfusePromptStore, PromptUnavailableError
from evoharness.sdk.prompts.store import (
    ACTIVE,
    CANDIDATE,
    PromptStore,
    RegistryPromptStore,
)
from evoharness.sdk.prompts.template import (
    DYNAMIC_KINDS,
    PromptStatus,
    PromptTemplate,
    PromptVersion,
    Section,
    SectionKind,
    bump,
    placeholders,
)

__all__ = [
    "ACTIVE",
    "CANDIDATE",
    "DYNAMIC_KINDS",
    "LangfusePromptStore",
    "PromptDiff",
    "PromptStatus",
    "PromptStore",
    "PromptTemplate",
    "PromptUnavailableError",
    "PromptVersion",
    "RegistryPromptStore",
    "Section",
    "SectionChange",
    "SectionKind",
    "bump",
    "diff_templates",
    "placeholders",
]
