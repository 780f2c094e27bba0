"""Hard constraints from the user's own words, kept verbatim and updated when restated."""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_core.messages import BaseMessage, HumanMessage

from evoharness.harness._messages import text_of

# slot -> cue pattern; a sentence with a cue states (or restates) that slot's constraint
SLOTS: dict[str, str] = {
    "budget": r"\b(budget|under|at most|no more than|max(imum)?|cheaper than)\b|\bcny\b|[$€£¥]",
    "exclude": r"\b(nothing made of|no |not |without|avoid|exclude|never)\b",
    "platform": r"\bonly (buy|from|use|on)\b|\bfrom (amazon|ebay|shopee|aliexpress)\b",
    "shipping": r"\b(shipping|deliver(y|ed)?|arrive)\b",
    "count": r"\b(\d+|one|two|three|four|five) [a-z ]*(items?|pieces?|units?)\b",
    "deadline": r"\b(by|before|until) (monday|tuesday|wednesday|thursday|friday|"
    r"saturday|sunday|tomorrow|\d)",
}
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")


def extract(messages: Sequence[BaseMessage], slots: dict[str, str] | None = None) -> dict[str, str]:
    """``slot -> sentence`` over all human messages, later statements replacing earlier ones.

    The sentences are the user's exact words, so they can be re-asserted verbatim.
    """
    rules = [(slot, re.compile(rx, re.I)) for slot, rx in (slots or SLOTS).items()]
    found: dict[str, str] = {}
    for m in messages:
        if not isinstance(m, HumanMessage):
            continue
        for sentence in _SENTENCE.findall(text_of(m)):
            s = sentence.strip()
            if not s:
                continue
            for slot, rx in rules:
                if rx.search(s):
                    found[slot] = s
    return found
