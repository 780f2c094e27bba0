"""Token counting that never touches the network.

The default is a documented approximation (about four characters per token, the usual rule of
thumb for English and JSON with BPE tokenizers); it is what the harness uses when the provider
does not report usage. Exact counts come from the provider's ``usage_metadata`` when present.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators in common chat templates


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
