"""W3C trace and span ids (the trace context that carries them: :mod:`.trace_context`)."""

from __future__ import annotations

import hashlib
import secrets


def trace_id_for(run_id: str) -> str:
    """The 32-hex W3C trace id of ``run_id`` (same algorithm as Langfuse's ``create_trace_id``)."""
    return hashlib.sha256(run_id.encode()).digest()[:16].hex()


def root_span_id(trace_id: str) -> str:
    """The deterministic 16-hex id of a trace's root (agent) observation."""
    return hashlib.sha256(f"root:{trace_id}".encode()).digest()[:8].hex()


def new_span_id() -> str:
    """A random, non-zero 16-hex W3C span id."""
    while True:
        value = secrets.token_hex(8)
        if value != "0" * 16:
            return value
