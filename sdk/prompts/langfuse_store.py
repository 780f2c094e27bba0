"""Prompt versions in Langfuse prompt management (SDK v5), with a fallback that never fails.

Mapping: one evoharness prompt version is one Langfuse *text* prompt version. The prompt text
is the template's sections joined with their ``{{placeholders}}`` intact (so Langfuse's UI and
``compile()`` work on it), and the structured form (sections, variables, semver, changelog,
author, parent, content hash) travels in the version's ``config`` under ``"evoharness"``.
Labels: our ``active`` is Langfuse's ``production``; ``candidate`` is ``candidate``; a promote
moves ``previous`` to the version that was in production, so ``rollback`` can restore it
(Langfuse keeps no label history).

Reads go through the SDK's prompt cache (``cache_ttl_seconds``; a stale entry is served while
it refreshes in the background). When Langfuse is unreachable or the label is missing and the
cache has nothing, :meth:`LangfusePromptStore.get` serves, in order: the ``fallback`` store
(e.g. the local registry), then the ``fallback_template``; the version it returns has
``fallback=True``. It raises only when neither is configured.
"""

from __future__ import annotations

import logging
from typing import Any

from evoharness.harness import require_extra
from evoharness.harness.errors import RunError
from evoharness.sdk.prompts.store import (
    ACTIVE,
    CANDIDATE,
    NewVersion,
    PromptStore,
)
from evoharness.sdk.prompts.template import PromptStatus, PromptTemplate, PromptVersion

log = logging.getLogger("evoharness.prompts")

PRODUCTION = "production"
PREVIOUS = "previous"


class PromptUnavailableError(RunError):
    """Langfuse could not serve a prompt and no fallback was configured.

    Attributes:
        name: The prompt asked for.
        label: The label asked for, if any.
    """

    def __init__(self, message: str, *, name: str, label: str | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.label = label


def _to_lf(label: str) -> str:
    return PRODUCTION if label == ACTIVE else label


def _from_lf(label: str) -> str:
    return ACTIVE if label == PRODUCTION else label


class LangfusePromptStore(PromptStore):
    """A :class:`~evoharness.sdk.prompts.PromptStore` backed by Langfuse prompt management.

    Args:
        client: A ``langfuse.Langfuse`` client (SDK v5). Build one per public key.
        cache_ttl_s: The SDK's prompt cache TTL (0 disables caching).
        fetch_timeout_s: Per-request timeout for prompt fetches.
        max_retries: Retries per fetch (the SDK's default of 2 adds seconds when Langfuse is
            down; the fallback makes retries unnecessary).
        fallback: Served when Langfuse cannot answer (typically a
            :class:`~evoharness.sdk.prompts.RegistryPromptStore` mirror).
        fallback_template: Served when there is no fallback store or it has nothing either.

    Example:
        >>> from langfuse import Langfuse  # doctest: +SKIP
        >>> store = LangfusePromptStore(Langfuse(public_key=..., secret_key=..., base_url=...),
        ...                             fallback_template=PromptTemplate.from_text("Be helpful."))
    """

    def __init__(
        self,
        client: Any,
        *,
        cache_ttl_s: int = 60,
        fetch_timeout_s: int = 5,
        max_retries: int = 0,
        fallback: PromptStore | None = None,
        fallback_template: PromptTemplate | None = None,
    ) -> None:
        require_extra("langfuse", extra="langfuse", feature="The Langfuse prompt backend")
        self.client = client
        self.cache_ttl_s = cache_ttl_s
        self.fetch_timeout_s = fetch_timeout_s
        self.max_retries = max_retries
        self.fallback = fallback
        self.fallback_template = fallback_template

    # -- conversion ------------------------------------------------------------------------
    @staticmethod
    def _status(labels: list[str]) -> PromptStatus:
        if ACTIVE in labels:
            return "active"
        if CANDIDATE in labels:
            return "testing"
        return "retired" if PREVIOUS in labels else "draft"

    def _version(self, prompt: Any) -> PromptVersion:
        config = prompt.config if isinstance(prompt.config, dict) else {}
        meta: dict[str, Any] = config.get("evoharness") or {}
        raw = prompt.prompt if isinstance(prompt.prompt, str) else str(prompt.prompt)
        template = (
            PromptTemplate.model_validate(meta["template"])
            if isinstance(meta.get("template"), dict)
            else PromptTemplate.from_text(raw)  # a prompt created in Langfuse's UI
        )
        labels = sorted(_from_lf(lb) for lb in prompt.labels if lb != "latest")
        return PromptVersion(
            name=prompt.name,
            version=int(prompt.version),
            template=template,
            semver=str(meta.get("semver", "1.0.0")),
            status=self._status(labels),
            changelog=str(meta.get("changelog", prompt.commit_message or "")),
            author=str(meta.get("author", "langfuse")),
            parent=meta.get("parent"),
            content_hash=template.content_hash,
            labels=labels,
        )

    # -- reads -----------------------------------------------------------------------------
    def _fetch(self, name: str, version: int | None, label: str | None) -> Any:
        return self.client.get_prompt(
            name,
            version=version,
            label=_to_lf(label) if label is not None else None,
            type="text",
            cache_ttl_seconds=self.cache_ttl_s,
            max_retries=self.max_retries,
            fetch_timeout_seconds=self.fetch_timeout_s,
        )

    def get(
        self, name: str, version: int | None = None, *, label: str | None = None
    ) -> PromptVersion:
        """One version by number or label (``active`` = Langfuse ``production`` by default).

        Never raises for an outage or a missing label when a fallback is configured.

        Raises:
            PromptUnavailableError: Langfuse failed and no fallback could serve.
        """
        if version is None and label is None:
            label = ACTIVE
        try:
            return self._version(self._fetch(name, version, label))
        except Exception as exc:  # outage, 404, auth: the app keeps running on the fallback
            reason = f"{type(exc).__name__}: {exc}"
        log.warning("prompt %r (%s) not served by Langfuse: %s", name, label or version, reason)
        if self.fallback is not None:
            try:
                found = self.fallback.get(name, version, label=label)
                return found.model_copy(update={"fallback": True})
            except Exception as exc:
                log.warning("fallback store could not serve prompt %r either: %s", name, exc)
        if self.fallback_template is not None:
            return PromptVersion(
                name=name,
                version=0,
                template=self.fallback_template,
                content_hash=self.fallback_template.content_hash,
                fallback=True,
                changelog="fallback template (Langfuse unavailable)",
            )
        raise PromptUnavailableError(
            f"Langfuse could not serve prompt {name!r} ({reason}) and the fallback store has no "
            "such version either: publish it there, or pass fallback_template=... too"
            if self.fallback is not None
            else f"Langfuse could not serve prompt {name!r} ({reason}) and no fallback is set: "
            "pass fallback=RegistryPromptStore(...) or fallback_template=... to "
            "LangfusePromptStore",
            name=name,
            label=label,
        )

    def _meta_list(self, name: str | None = None) -> list[Any]:
        out: list[Any] = []
        page = 1
        while True:
            resp = self.client.api.prompts.list(name=name, page=page, limit=100)
            out.extend(resp.data)
            if page >= int(resp.meta.total_pages or 1):
                return out
            page += 1

    def versions(self, name: str) -> list[PromptVersion]:
        """All versions, oldest first (one fetch per version, through the SDK cache)."""
        numbers = sorted({v for m in self._meta_list(name) if m.name == name for v in m.versions})
        return [self._version(self._fetch(name, n, None)) for n in numbers]

    def names(self) -> list[str]:
        """All prompt names in the project."""
        return sorted({m.name for m in self._meta_list()})

    def labels(self, name: str) -> dict[str, int]:
        """Label -> version (``production`` reported as ``active``)."""
        return {lb: v.version for v in self.versions(name) for lb in v.labels}

    def active_version(self, name: str) -> int | None:
        """The ``production`` version's number, through the SDK's prompt cache (``None``
        when Langfuse cannot tell: the caller then falls back through :meth:`get`)."""
        try:
            return int(self._fetch(name, None, ACTIVE).version)
        except Exception:
            return None

    # -- writes ----------------------------------------------------------------------------
    def _previous(self, name: str, parent: int | None) -> PromptVersion | None:
        if parent is not None:
            return self._version(self._fetch(name, parent, None))
        existing = self.versions(name) if name in self.names() else []
        return existing[-1] if existing else None

    def _publish(self, new: NewVersion) -> PromptVersion:
        """A new Langfuse prompt version, without labels: it serves nothing until promoted."""
        meta = {
            "template": new.template.content(),
            "semver": new.semver,
            "changelog": new.changelog,
            "author": new.author,
            "parent": new.parent,
        }
        created = self.client.create_prompt(
            name=new.name,
            prompt=new.template.raw_text(),
            labels=[],
            type="text",
            config={"evoharness": meta},
            commit_message=new.changelog or None,
        )
        return self._version(created)

    def _labels_of(self, name: str, version: int) -> list[str]:
        return [lb for lb in self._fetch_uncached(name, version).labels if lb != "latest"]

    def _fetch_uncached(self, name: str, version: int) -> Any:
        return self.client.api.prompts.get(name, version=version)

    def set_label(
        self, name: str, label: str, version: int, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Add ``label`` to ``version`` (Langfuse moves it off any other version)."""
        keep = self._labels_of(name, version)
        self.client.update_prompt(
            name=name, version=version, new_labels=sorted({*keep, _to_lf(label)})
        )
        log.info("prompt %r: %s -> v%d by %s (%s)", name, label, version, actor, reason)

    def unlabel(
        self, name: str, label: str, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Remove ``label`` from whichever version carries it (nothing if none does)."""
        version = self.labels(name).get(label)
        if version is None:
            return
        keep = [lb for lb in self._labels_of(name, version) if lb != _to_lf(label)]
        self.client.update_prompt(name=name, version=version, new_labels=keep)
        log.info("prompt %r: %s removed from v%d by %s (%s)", name, label, version, actor, reason)

    def promote(
        self, name: str, version: int, *, actor: str = "evoharness", reason: str = ""
    ) -> None:
        """Move ``production`` to ``version`` and ``previous`` to the old production one."""
        current = self.labels(name).get(ACTIVE)
        if current is not None and current != version:
            self.set_label(name, PREVIOUS, current, actor=actor, reason=reason)
        self.set_label(name, ACTIVE, version, actor=actor, reason=reason)

    def rollback(self, name: str, *, actor: str = "evoharness", reason: str = "") -> int:
        """Move ``production`` back to the ``previous`` version; returns it.

        Raises:
            PromptUnavailableError: No version carries the ``previous`` label.
        """
        target = self.labels(name).get(PREVIOUS)
        if target is None:
            raise PromptUnavailableError(
                f"prompt {name!r} has no 'previous' label in Langfuse: nothing to roll back to; "
                "promote an explicit version instead",
                name=name,
                label=PREVIOUS,
            )
        keep = [lb for lb in self._labels_of(name, target) if lb != PREVIOUS]
        self.client.update_prompt(name=name, version=target, new_labels=sorted({*keep, PRODUCTION}))
        log.info("prompt %r: rolled back to v%d by %s (%s)", name, target, actor, reason)
        return target
