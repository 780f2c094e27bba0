"""A prompt as data: ordered, typed sections, variables, and the version record around them.

A :class:`PromptTemplate` is the content of a ``prompt`` artifact in the registry (what the
content hash covers); a :class:`PromptVersion` is one published version of it with its
lifecycle fields (semver, status, changelog, author, parent). Static sections (role,
constraints, tool policy, examples) always come before dynamic ones (user preferences,
context): the rendered system prompt then starts with a byte-identical static prefix that the
provider's prompt cache can reuse across sessions.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evoharness.harness.errors import ConfigError
from evoharness.sdk.registry.base import content_hash

SectionKind = Literal[
    "role", "constraints", "tool_policy", "examples", "user_preferences", "context", "custom"
]
PromptStatus = Literal["draft", "testing", "active", "retired"]

#: Kinds whose text changes per user or per session: rendered after every static section.
DYNAMIC_KINDS: frozenset[str] = frozenset({"user_preferences", "context"})

_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")


def placeholders(text: str) -> list[str]:
    """The ``{{variable}}`` names used in ``text``, in order of first use."""
    seen: dict[str, None] = {}
    for m in _VAR.finditer(text):
        seen.setdefault(m.group(1), None)
    return list(seen)


class Section(BaseModel):
    """One part of a system prompt.

    Attributes:
        name: Unique within the template; diffs match sections by name.
        kind: What the section is for; ``user_preferences`` and ``context`` are dynamic.
        text: The text, with ``{{variable}}`` placeholders (Langfuse's syntax).
        protected: Evolve's proposals may not change it (safety rules, legal constraints);
            a new version that does must be published with ``allow_protected_changes=True``.
        dynamic: Overrides the kind's default (static unless the kind is dynamic).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    kind: SectionKind = "custom"
    text: str
    protected: bool = False
    dynamic: bool | None = None

    @property
    def is_dynamic(self) -> bool:
        """Whether the section is rendered after the static prefix."""
        return self.kind in DYNAMIC_KINDS if self.dynamic is None else self.dynamic


class PromptTemplate(BaseModel):
    """Ordered sections plus declared variables: the content of a prompt version.

    Sections are kept in the given order except that every static section moves before the
    first dynamic one (a stable partition), so equal prompts hash equally however they were
    written.

    Args:
        sections: The sections; names must be unique.
        variables: Declared variables and their defaults (``None``: required at render time).
            Every ``{{name}}`` used in a section must be declared.

    Example:
        >>> t = PromptTemplate(sections=[
        ...     Section(name="prefs", kind="user_preferences", text="User likes {{style}}."),
        ...     Section(name="role", kind="role", text="You are a shopping assistant."),
        ... ], variables={"style": "short answers"})
        >>> t.render()
        'You are a shopping assistant.\\n\\nUser likes short answers.'
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sections: list[Section] = Field(min_length=1)
    variables: dict[str, str | None] = Field(default_factory=dict)

    @field_validator("sections")
    @classmethod
    def _static_first(cls, sections: list[Section]) -> list[Section]:
        names = [s.name for s in sections]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"section names must be unique; repeated: {dupes}")
        return [s for s in sections if not s.is_dynamic] + [s for s in sections if s.is_dynamic]

    @model_validator(mode="after")
    def _declared(self) -> PromptTemplate:
        used = {v for s in self.sections for v in placeholders(s.text)}
        missing = sorted(used - set(self.variables))
        if missing:
            raise ValueError(
                f"sections use undeclared variables {missing}: add them to `variables` "
                "(with a default, or None to require a value at render time)"
            )
        return self

    @classmethod
    def from_text(cls, text: str, *, kind: SectionKind = "role") -> PromptTemplate:
        """A one-section template from a plain system prompt (variables declared, required)."""
        return cls(
            sections=[Section(name="main", kind=kind, text=text)],
            variables=dict.fromkeys(placeholders(text)),
        )

    def content(self) -> dict[str, Any]:
        """The JSON stored in the registry (what the content hash covers)."""
        return self.model_dump(mode="json", exclude_none=False)

    @property
    def content_hash(self) -> str:
        """SHA-256 of :meth:`content`."""
        return content_hash(self.content())

    def section(self, name: str) -> Section | None:
        """The section called ``name``, if any."""
        return next((s for s in self.sections if s.name == name), None)

    def _fill(self, text: str, values: dict[str, Any]) -> str:
        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name in values:
                return str(values[name])
            default = self.variables.get(name)
            if default is None:
                raise ConfigError(
                    f"prompt variable {name!r} has no value and no default: pass it to "
                    f"render({name}=...) or declare a default in `variables`",
                    field=name,
                )
            return default

        return _VAR.sub(sub, text)

    def static_prefix(self, **values: Any) -> str:
        """The rendered static sections: identical for every session that shares them."""
        return "\n\n".join(self._fill(s.text, values) for s in self.sections if not s.is_dynamic)

    def render(self, **values: Any) -> str:
        """The system prompt text: static sections first, then dynamic ones.

        Raises:
            ConfigError: A required variable has no value.
        """
        return "\n\n".join(self._fill(s.text, values) for s in self.sections if s.text)

    def raw_text(self) -> str:
        """The sections joined with their ``{{placeholders}}`` left in (Langfuse's form)."""
        return "\n\n".join(s.text for s in self.sections if s.text)


def bump(semver: str, part: Literal["major", "minor", "patch"] = "minor") -> str:
    """The next semantic version: ``bump("1.2.3") == "1.3.0"``."""
    m = _SEMVER.match(semver)
    if m is None:
        raise ConfigError(f"not a semantic version: {semver!r} (use MAJOR.MINOR.PATCH)")
    major, minor, patch = (int(g) for g in m.groups())
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    return f"{major}.{minor}.{patch + 1}"


def check_semver(semver: str) -> str:
    """``semver`` if it is ``MAJOR.MINOR.PATCH``; raises :class:`ConfigError` otherwise."""
    if _SEMVER.match(semver) is None:
        raise ConfigError(f"not a semantic version: {semver!r} (use MAJOR.MINOR.PATCH)")
    return semver


class PromptVersion(BaseModel):
    """One published version of a prompt, as the runtime and the CLI see it.

    Attributes:
        name: The prompt's name.
        version: The backend's version number (registry or Langfuse); 0 for a fallback.
        template: The sections and variables.
        semver: Human version (``MAJOR.MINOR.PATCH``).
        status: ``draft`` → ``testing`` (in a rollout) → ``active`` → ``retired``.
        changelog: What changed and why.
        author: Who published it.
        parent: The version it was derived from.
        content_hash: :attr:`PromptTemplate.content_hash`.
        labels: Labels pointing at it (``active``, ``candidate``, ...).
        created_at: Unix time of publication.
        fallback: True when served from a fallback because the backend was unreachable or the
            label was missing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: int
    template: PromptTemplate
    semver: str = "1.0.0"
    status: PromptStatus = "draft"
    changelog: str = ""
    author: str = "evoharness"
    parent: int | None = None
    content_hash: str = ""
    labels: list[str] = Field(default_factory=list)
    created_at: float = 0.0
    fallback: bool = False

    @property
    def ref(self) -> str:
        """``prompt/<name>@v<version>``, the form recorded on traces."""
        return f"prompt/{self.name}@v{self.version}"

    def render(self, **values: Any) -> str:
        """:meth:`PromptTemplate.render` of this version."""
        return self.template.render(**values)
