"""Pull one JSON object out of a model's reply (private)."""

from __future__ import annotations

from typing import Any

from evoharness.harness import first_json_object


def extract_json(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (fenced or bare); raises ``ValueError`` if none."""
    found = first_json_object(text)
    if found is None:
        raise ValueError(f"no JSON object in model output: {text[:200]!r}")
    return found
