"""Judge and rubric prompts as registry artifacts (kinds ``judge_prompt``, ``rubric_prompt``).

The texts evolve judges with are versioned like everything else it publishes: immutable
versions with content hashes, an ``active`` label, audited promote and rollback. A verdict
records the version it was judged with (``judge_prompt/absolute@v3``), so promoting a new
prompt re-grades what the old one judged. Without a registry, a prompt's version is its
content hash (:func:`~evoharness.evolve.judging.judge.prompt_ref`).
"""

from __future__ import annotations

from evoharness.evolve.judging.judge import JUDGE_PROMPT, RELATIVE_PROMPT
from evoharness.evolve.judging.rubric import RUBRIC_PROMPT
from evoharness.sdk.registry.base import ArtifactNotFound, ArtifactVersion, Registry

JUDGE_PROMPT_KIND = "judge_prompt"
RUBRIC_PROMPT_KIND = "rubric_prompt"
DEFAULTS: dict[tuple[str, str], str] = {
    (JUDGE_PROMPT_KIND, "absolute"): JUDGE_PROMPT,
    (JUDGE_PROMPT_KIND, "relative"): RELATIVE_PROMPT,
    (RUBRIC_PROMPT_KIND, "default"): RUBRIC_PROMPT,
}
"""The built-in texts, published as version 1 when a registry has none."""


class JudgePrompts:
    """Read and publish the judge and rubric prompts of one registry.

    Args:
        registry: Where the versions live.
        label: The label judges read.
        author: Recorded on published versions and label moves.
    """

    def __init__(
        self, registry: Registry, *, label: str = "active", author: str = "evoharness"
    ) -> None:
        self.registry = registry
        self.label = label
        self.author = author

    def ensure_defaults(self) -> None:
        """Publish and activate the built-in texts where nothing is active yet."""
        for (kind, name), text in DEFAULTS.items():
            try:
                self.registry.get(kind, name, label=self.label)
            except ArtifactNotFound:
                self.publish(kind, name, text, reason="built-in default")

    def get(self, kind: str, name: str) -> tuple[str, str]:
        """The active text of ``kind/name`` and its version reference.

        Raises:
            ArtifactNotFound: Nothing is active (call :meth:`ensure_defaults`).
        """
        version = self.registry.get(kind, name, label=self.label)
        return str(version.content["text"]), version.ref

    def publish(
        self, kind: str, name: str, text: str, *, activate: bool = True, reason: str = ""
    ) -> ArtifactVersion:
        """Store ``text`` as a version of ``kind/name`` and, with ``activate``, serve it."""
        stored = self.registry.publish(kind, name, {"text": text}, author=self.author)
        if activate:
            self.registry.promote(
                kind, name, stored.version, label=self.label, actor=self.author, reason=reason
            )
        return stored
