"""The Agent Skills format: a folder with a ``SKILL.md`` (YAML front matter + Markdown) and files.

A skill folder, as Anthropic published the format and LangChain's deepagents reads it::

    shop-apparel/
    ├── SKILL.md        # ---\\nname: shop-apparel\\ndescription: ...\\n---\\n<instructions>
    └── workflow.json   # optional files: scripts, resources, a compiled workflow

Front matter keys: ``name`` (1-64 characters, lowercase letters, digits and single hyphens,
the folder's name), ``description`` (1-1024 characters: what the skill does and when to
use it), and optionally ``license``, ``compatibility``, ``allowed-tools`` (space-separated)
and ``metadata`` (string to string). Other keys are kept as they are. :class:`Skill` is
one such folder in memory; :func:`import_skill` / :func:`export_skill` read and write it,
byte-stable (export, import, export gives the same bytes).
"""

from __future__ import annotations

import base64
import importlib
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evoharness.harness.errors import ConfigError
from evoharness.sdk.registry.base import content_hash

__all__ = [
    "SKILL_FILE",
    "Skill",
    "SkillFormatError",
    "export_skill",
    "export_skills",
    "import_skill",
    "import_skills",
    "skill_name",
]

SKILL_FILE = "SKILL.md"
MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_BYTES = 1 << 20
"""The most a skill folder may hold (all files together) when imported."""

# PyYAML ships no type stubs (langchain-core depends on it, so it is always installed)
yaml: Any = importlib.import_module("yaml")

_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)
_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_KNOWN = ("name", "description", "license", "compatibility", "allowed-tools", "metadata")


class SkillFormatError(ConfigError):
    """A skill folder or ``SKILL.md`` does not follow the Agent Skills format.

    Attributes:
        path: The folder or file, when the skill came from disk.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message, field="skill")
        self.path = path


def skill_name(text: str) -> str:
    """A valid skill name made from ``text`` (lowercase, hyphens, at most 64 characters).

    Example:
        >>> skill_name("Shop: home_decor")
        'shop-home-decor'
    """
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:MAX_NAME].rstrip("-") or "skill"


def _check_path(name: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts or name != str(path):
        raise SkillFormatError(
            f"skill file {name!r} must be a relative path inside the skill folder "
            "(no '..', no leading '/')"
        )
    if name == SKILL_FILE:
        raise SkillFormatError(f"{SKILL_FILE} is the skill itself, not one of its files")
    return name


class Skill(BaseModel):
    """One skill: front matter, instructions and files.

    Attributes:
        name: The skill's name (also its folder's name).
        description: What it does and when to use it (what an agent sees first).
        body: The Markdown instructions (what ``load_skill`` returns).
        license: License name or file, if given.
        compatibility: Environment requirements, if given.
        allowed_tools: Tools the skill recommends (``allowed-tools``).
        metadata: Free string pairs (evolve writes ``case_pattern``, ``support``, ...).
        files: Other text files by relative path (e.g. ``workflow.json``).
        binary_files: Other files that are not UTF-8 text, base64-encoded.
        extra: Front matter keys outside the format, kept as they were.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    body: str = ""
    license: str | None = None
    compatibility: str | None = None
    allowed_tools: list[str] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)
    binary_files: dict[str, str] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if len(v) > MAX_NAME or not _NAME.match(v):
            raise ValueError(
                f"skill name {v!r} must be 1-{MAX_NAME} lowercase letters, digits and single "
                f"hyphens (e.g. {skill_name(v)!r})"
            )
        return v

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        v = v.strip()
        if not 1 <= len(v) <= MAX_DESCRIPTION:
            raise ValueError(f"a skill description has 1-{MAX_DESCRIPTION} characters")
        return v

    @field_validator("body")
    @classmethod
    def _body(cls, v: str) -> str:
        # one normal form, so that writing and reading a skill gives it back exactly
        v = v.lstrip("\r\n").rstrip()
        return f"{v}\n" if v else ""

    @field_validator("files", "binary_files")
    @classmethod
    def _files(cls, v: dict[str, str]) -> dict[str, str]:
        return {_check_path(k): v[k] for k in sorted(v)}

    @property
    def content_hash(self) -> str:
        """SHA-256 of the skill's canonical JSON (what the registry stores)."""
        return content_hash(self.model_dump(mode="json"))

    @property
    def case_pattern(self) -> str | None:
        """The case pattern the skill is offered for (``metadata.case_pattern``), if any."""
        return self.metadata.get("case_pattern") or None

    def front_matter(self) -> dict[str, Any]:
        """The YAML front matter, in the format's key order."""
        data: dict[str, Any] = {"name": self.name, "description": self.description}
        if self.license is not None:
            data["license"] = self.license
        if self.compatibility is not None:
            data["compatibility"] = self.compatibility
        if self.allowed_tools:
            data["allowed-tools"] = " ".join(self.allowed_tools)
        if self.metadata:
            data["metadata"] = dict(sorted(self.metadata.items()))
        data.update(sorted(self.extra.items()))
        return data

    def to_markdown(self) -> str:
        """The ``SKILL.md`` text."""
        head = yaml.safe_dump(
            self.front_matter(), sort_keys=False, allow_unicode=True, width=10_000
        )
        return f"---\n{head}---\n\n{self.body}" if self.body else f"---\n{head}---\n"

    @classmethod
    def from_markdown(
        cls,
        text: str,
        *,
        files: dict[str, str] | None = None,
        binary_files: dict[str, str] | None = None,
        path: str | None = None,
    ) -> Skill:
        """Parse a ``SKILL.md``.

        Raises:
            SkillFormatError: No front matter, invalid YAML, or a missing or invalid
                ``name`` or ``description``.
        """
        match = _FRONT_MATTER.match(text)
        where = f" in {path}" if path else ""
        if match is None:
            raise SkillFormatError(
                f"no YAML front matter{where}: a SKILL.md starts with '---', the keys name and "
                "description, and '---'",
                path=path,
            )
        try:
            data = yaml.safe_load(match.group(1))
        except yaml.YAMLError as exc:
            raise SkillFormatError(f"invalid YAML front matter{where}: {exc}", path=path) from exc
        if not isinstance(data, dict):
            raise SkillFormatError(f"the front matter{where} is not a mapping", path=path)
        tools = data.get("allowed-tools")
        if isinstance(tools, str):
            tools = [t for t in re.split(r"[\s,]+", tools) if t]
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise SkillFormatError(f"metadata{where} must be a mapping", path=path)
        try:
            return cls(
                name=str(data.get("name", "")).strip(),
                description=str(data.get("description", "")),
                body=text[match.end() :],
                license=None if data.get("license") is None else str(data["license"]),
                compatibility=(
                    None if data.get("compatibility") is None else str(data["compatibility"])
                ),
                allowed_tools=[str(t) for t in tools or []],
                metadata={str(k): str(v) for k, v in metadata.items()},
                files=files or {},
                binary_files=binary_files or {},
                extra={k: v for k, v in data.items() if k not in _KNOWN},
            )
        except ValueError as exc:
            raise SkillFormatError(f"invalid skill{where}: {exc}", path=path) from exc


def import_skill(folder: Path | str, *, max_bytes: int = MAX_BYTES) -> Skill:
    """Read one skill folder (``SKILL.md`` and every other file in it).

    Raises:
        SkillFormatError: No ``SKILL.md``, a ``name`` that is not the folder's name, a
            folder larger than ``max_bytes``, or an invalid ``SKILL.md``.
    """
    root = Path(folder)
    md = root / SKILL_FILE
    if not md.is_file():
        raise SkillFormatError(f"{root} has no {SKILL_FILE}", path=str(root))
    files: dict[str, str] = {}
    binary: dict[str, str] = {}
    total = 0
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p == md:
            continue
        data = p.read_bytes()
        total += len(data)
        rel = p.relative_to(root).as_posix()
        try:
            files[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            binary[rel] = base64.b64encode(data).decode("ascii")
    text = md.read_text(encoding="utf-8")
    total += len(text.encode())
    if total > max_bytes:
        raise SkillFormatError(
            f"{root} holds {total} bytes, more than {max_bytes}: keep large resources out "
            "of skills (or raise max_bytes)",
            path=str(root),
        )
    skill = Skill.from_markdown(text, files=files, binary_files=binary, path=str(md))
    if skill.name != root.name:
        raise SkillFormatError(
            f"skill {skill.name!r} lives in folder {root.name!r}: the format wants the "
            f"folder named after the skill (rename it to {skill.name})",
            path=str(root),
        )
    return skill


def export_skill(skill: Skill, parent: Path | str) -> Path:
    """Write ``skill`` as ``parent/<name>/`` (replacing files of the same names); returns
    the folder."""
    root = Path(parent) / skill.name
    root.mkdir(parents=True, exist_ok=True)
    (root / SKILL_FILE).write_text(skill.to_markdown(), encoding="utf-8")
    for rel, text in skill.files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    for rel, b64 in skill.binary_files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(b64))
    return root


def import_skills(root: Path | str, *, max_bytes: int = MAX_BYTES) -> list[Skill]:
    """Every skill folder directly under ``root`` (folders without ``SKILL.md`` are
    skipped), by name.

    Raises:
        SkillFormatError: A skill folder is invalid, or two folders hold one name.
    """
    skills = [
        import_skill(p, max_bytes=max_bytes)
        for p in sorted(Path(root).iterdir())
        if p.is_dir() and (p / SKILL_FILE).is_file()
    ]
    return sorted(skills, key=lambda s: s.name)


def export_skills(skills: Iterable[Skill], root: Path | str) -> list[Path]:
    """Write each skill as a folder under ``root``; returns the folders."""
    return [export_skill(s, root) for s in sorted(skills, key=lambda s: s.name)]
