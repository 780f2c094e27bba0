"""Find the first JSON object in model output (judges, summarisers, checkers)."""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (fenced or bare), or ``None``."""
    for candidate in [m.group(1) for m in _FENCE.finditer(text)] + [text]:
        start = candidate.find("{")
        while start != -1:
            depth = 0
            for i in range(start, len(candidate)):
                if candidate[i] == "{":
                    depth += 1
                elif candidate[i] == "}":
                    depth -= 1
                    if depth == 0:
                        try:
                            value = json.loads(candidate[start : i + 1])
                        except ValueError:
                            break
                        if isinstance(value, dict):
                            return value
                        break
            start = candidate.find("{", start + 1)
    return None
