"""Adapter versions in the artifact registry, and the offline gate that makes one a candidate.

An adapter version is an ``adapter`` artifact named after its policy. Its content records the
adapter directory, a checksum of its files, the base model and the LoRA shape; its metadata
the dataset manifest (with trace-id provenance), the training metrics and the run fingerprint.
Served names are ``<policy>-v<N>``: immutable, never reused (vLLM caches by name).

Status comes from the registry's labels and audit log: ``active`` (label ``active``),
``candidate`` (label ``candidate``), ``rejected`` (the gate turned it down: a ``gate-rejected``
label event) or ``published``.

The gate is the paired one every artifact kind goes through
(:func:`~evoharness.evolve.promotion.paired_gate`); :class:`TaskEval`, :class:`EvalResult`
and :class:`GateDecision` are its types.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from evoharness.evolve.promotion import REJECTED, EvalResult, GateDecision, TaskEval, paired_gate
from evoharness.harness import ConfigError
from evoharness.sdk.registry import ArtifactNotFound, ArtifactVersion, Registry, RegistryEvent
from evoharness.sdk.serving.errors import AdapterLoadError

__all__ = [
    "KIND",
    "REJECTED",
    "AdapterStatus",
    "EvalResult",
    "GateDecision",
    "TaskEval",
    "activate",
    "active_version",
    "adapter_checksum",
    "apply_gate",
    "offline_gate",
    "publish_adapter",
    "rollback",
    "served_name",
    "status",
    "verified_path",
]

KIND = "adapter"
AdapterStatus = Literal["active", "candidate", "rejected", "published"]


def adapter_checksum(directory: Path | str, *, adapter: str = "") -> str:
    """SHA-256 over the adapter's files (names and bytes, sorted; tokenizer files excluded).

    Raises:
        AdapterLoadError: The directory is missing or unreadable (``adapter`` names it).
        ConfigError: The directory holds no PEFT adapter.
    """
    root = Path(directory)
    label = f"adapter {adapter} at {root}" if adapter else f"adapter directory {root}"
    try:
        files = sorted(p for p in root.iterdir() if p.is_file() and p.name.startswith("adapter_"))
        if not any(p.name == "adapter_config.json" for p in files):
            raise ConfigError(
                f"{root} is not a PEFT adapter (no adapter_config.json)", field="path"
            )
        h = hashlib.sha256()
        for p in files:
            h.update(p.name.encode() + b"\0")
            h.update(p.read_bytes())
    except OSError as exc:
        why = "does not exist" if isinstance(exc, FileNotFoundError) else "cannot be read"
        raise AdapterLoadError(
            f"{label} {why} ({type(exc).__name__}: {exc.strerror or exc}): restore the "
            "directory, or train and publish a new version",
            adapter=adapter,
            path=str(root),
            reason=f"{type(exc).__name__}: {exc}",
        ) from exc
    return "sha256:" + h.hexdigest()


def served_name(version: ArtifactVersion) -> str:
    """``<policy>-v<N>``: the name the version is served under (never reused)."""
    return f"{version.name}-v{version.version}"


def publish_adapter(
    registry: Registry,
    policy: str,
    adapter_dir: Path | str,
    *,
    base_model: str,
    dataset_manifest: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    fingerprint: str | None = None,
    author: str = "evoharness",
    parent: int | None = None,
) -> ArtifactVersion:
    """Publish a trained adapter as the next immutable version of ``policy``.

    Raises:
        AdapterLoadError: ``adapter_dir`` is missing or its files cannot be read.
        ConfigError: ``adapter_dir`` is not a PEFT adapter, or it carries
            ``modules_to_save`` (vLLM cannot serve that).
    """
    root = Path(adapter_dir).resolve()
    checksum = adapter_checksum(root, adapter=policy)
    try:
        config = json.loads((root / "adapter_config.json").read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise AdapterLoadError(
            f"adapter {policy} at {root}: adapter_config.json cannot be read "
            f"({type(exc).__name__}: {exc}); save the adapter again (save_pretrained)",
            adapter=policy,
            path=str(root),
            reason=f"{type(exc).__name__}: {exc}",
        ) from exc
    if config.get("modules_to_save"):
        raise ConfigError(
            f"adapter {root} has modules_to_save={config['modules_to_save']}: vLLM cannot serve "
            "it; train with LoRASpec (no modules_to_save)",
            field="adapter_dir",
        )
    content = {
        "path": str(root),
        "checksum": checksum,
        "base_model": base_model,
        "lora": {
            "r": config.get("r"),
            "alpha": config.get("lora_alpha"),
            "target_modules": config.get("target_modules"),
        },
    }
    for existing in registry.versions(KIND, policy):
        if existing.content == content:  # the same files, published before: one version
            return existing
    metadata = {
        "dataset_manifest": dataset_manifest or {},
        "metrics": metrics or {},
        "fingerprint": fingerprint,
    }
    return registry.publish(KIND, policy, content, metadata=metadata, author=author, parent=parent)


def verified_path(version: ArtifactVersion) -> Path:
    """The adapter directory of ``version``, after checking its files still match.

    Raises:
        AdapterLoadError: The directory was deleted or cannot be read.
        ConfigError: The files changed after publishing.
    """
    path = Path(version.content["path"])
    actual = adapter_checksum(path, adapter=served_name(version))
    if actual != version.content["checksum"]:
        raise ConfigError(
            f"adapter {served_name(version)} at {path} changed after publishing "
            f"({actual[:19]}… != {version.content['checksum'][:19]}…); publish a new version",
            field="adapter",
        )
    return path


def status(registry: Registry, policy: str, version: int) -> AdapterStatus:
    """The status of one version (from labels and the audit log)."""
    labels = registry.labels(KIND, policy)
    if labels.get("active") == version:
        return "active"
    if labels.get("candidate") == version:
        return "candidate"
    for e in registry.events(KIND, policy):
        if e.label == REJECTED and e.version == version:
            return "rejected"
    return "published"


offline_gate = paired_gate
"""The adapter gate: :func:`~evoharness.evolve.promotion.paired_gate`, the paired one every
artifact kind goes through (an exact McNemar test on the frozen val split with at least
``min_tasks`` tasks, zero new P0 on the separate guard split; the report split's numbers are
carried, never decided on)."""


def apply_gate(
    registry: Registry, policy: str, version: int, decision: GateDecision, *, actor: str = "gate"
) -> RegistryEvent:
    """Label ``version`` ``candidate`` (passed) or record the rejection (audited)."""
    label = "candidate" if decision.passed else REJECTED
    return registry.set_label(KIND, policy, label, version, actor=actor, reason=decision.reason)


def activate(
    registry: Registry, policy: str, version: int, *, actor: str = "evoharness", reason: str = ""
) -> RegistryEvent:
    """Promote a ``candidate`` (or the already active) version to ``active``.

    Raises:
        ConfigError: The version did not pass the gate.
    """
    if status(registry, policy, version) not in ("candidate", "active"):
        raise ConfigError(
            f"{policy}-v{version} is not a candidate: run the offline gate first",
            field="version",
        )
    return registry.promote(KIND, policy, version, actor=actor, reason=reason)


def rollback(
    registry: Registry, policy: str, *, actor: str = "evoharness", reason: str = ""
) -> RegistryEvent:
    """Point ``active`` back at the version it served before the last promote."""
    return registry.rollback(KIND, policy, actor=actor, reason=reason)


def active_version(registry: Registry, policy: str) -> ArtifactVersion | None:
    """The active adapter version, or ``None`` (serve the base model)."""
    try:
        return registry.get(KIND, policy, label="active")
    except ArtifactNotFound:
        return None
