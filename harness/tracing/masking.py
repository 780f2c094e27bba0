"""Mask secrets and configured PII before anything is stored or exported."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Secrets are always masked; they are never configuration.
SECRET_PATTERNS: dict[str, str] = {  # order matters: specific prefixes first
    "anthropic_key": r"\bsk-ant-[A-Za-z0-9_-]{16,}",
    "openai_key": r"\bsk-(?:proj-)?[A-Za-z0-9_-]{16,}",
    "langfuse_key": r"\b[ps]k-lf-[A-Za-z0-9-]{8,}",
    "aws_access_key": r"\bAKIA[0-9A-Z]{16}\b",
    "github_token": r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    "bearer_token": r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}",
    "basic_auth": r"(?i)\bbasic\s+[A-Za-z0-9+/=]{12,}",
    "private_key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
}
PII_PATTERNS: dict[str, str] = {
    "email": r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b",
    "phone": r"(?<!\w)\+?\d[\d -]{8,}\d\b",
    "credit_card": r"\b(?:\d[ -]?){13,16}\b",
}
SECRET_KEYS = re.compile(
    r"(?i)^(?:.*[_-])?(?:api[_-]?key|secret(?:[_-]key)?|password|passwd|access[_-]?token|"
    r"auth[_-]?token|refresh[_-]?token|authorization)$"
)

_CACHE_MAX_CHARS = 16_384  # longer texts are masked every time rather than held


@functools.lru_cache(maxsize=1024)
def _secret_key(key: str) -> bool:
    return SECRET_KEYS.search(key) is not None


@dataclass
class Masker:
    """Replaces secrets (always) and the configured PII kinds with ``[masked:<kind>]``.

    Also masks the value of any mapping key that names a secret (``api_key``, ``password``,
    ``authorization``...), whatever it looks like.

    Args:
        pii: PII kinds to mask (default: email and phone); see :data:`PII_PATTERNS`.
        extra: Additional ``name -> regex`` patterns.
    """

    pii: Iterable[str] = ("email", "phone")
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.pii) - set(PII_PATTERNS)
        if unknown:
            raise ValueError(f"unknown PII kinds {sorted(unknown)}; known: {sorted(PII_PATTERNS)}")
        patterns = {**SECRET_PATTERNS, **{k: PII_PATTERNS[k] for k in self.pii}, **self.extra}
        self._rules = [(name, re.compile(rx), f"[masked:{name}]") for name, rx in patterns.items()]
        # A generation records the whole conversation so far, so each message's text is
        # masked again on every later call; the cache makes that a lookup (the same string
        # objects come back, with their hash already computed).
        self._cached = functools.lru_cache(maxsize=4096)(self._mask)

    def _mask(self, value: str) -> str:
        for _, rx, label in self._rules:
            value = rx.sub(label, value)
        return value

    def text(self, value: str) -> str:
        """Mask one string."""
        return self._cached(value) if len(value) <= _CACHE_MAX_CHARS else self._mask(value)

    def __call__(self, value: Any) -> Any:
        """Mask strings anywhere inside ``value`` (dicts, lists, tuples), returning a copy."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                k: "[masked:secret]"
                if isinstance(k, str) and _secret_key(k) and isinstance(v, str)
                else self(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        return value
