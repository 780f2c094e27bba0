"""Cases: how episodes are grouped (a query pattern, or the environment's case key).

Curation deduplicates memory entries per case, layer routing and prompt clustering group
failures per case; all of them key a diagnosis package the same way, through
:func:`case_of`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from evoharness.harness.text import content_words

__all__ = ["CaseKey", "PatternFn", "case_of", "default_case_key", "default_pattern"]

PatternFn = Callable[[str], str]
"""Maps a query to its pattern (what memory retrieval matches on)."""
CaseKey = Callable[[str, Mapping[str, Any]], str]
"""Maps (query, trace metadata) to a case key (``EvolveEnvironment.case_key``)."""


def default_pattern(query: str) -> str:
    """A query pattern: its first six content words in order (override per domain)."""
    seen: list[str] = []
    for w in query.lower().split():
        w = w.strip(".,;:!?")
        if w in content_words(w) and w not in seen and not w.isdigit():
            seen.append(w)
    return " ".join(seen[:6])


def default_case_key(query: str, metadata: Mapping[str, Any]) -> str:
    """The key cases are grouped and deduplicated by: the task id recorded in the trace's
    metadata (when there is one) followed by the query's first content words."""
    words = default_pattern(query)
    task = metadata.get("task_id")
    return f"{task} {words}".strip() if task is not None else words


def case_of(
    pkg: Mapping[str, Any], case_key: CaseKey | None, pattern: PatternFn = default_pattern
) -> str:
    """The case of a diagnosis package: ``case_key(query, metadata)`` when given, else the
    query's ``pattern``."""
    query = str(pkg.get("query") or "")
    if case_key is not None:
        return case_key(query, pkg.get("metadata") or {})
    return pattern(query)
