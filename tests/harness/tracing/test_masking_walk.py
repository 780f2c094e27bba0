"""The masker's walk over payloads (exact-type fast paths) masks exactly what the plain
recursive walk does, for every container, key and leaf type."""

from __future__ import annotations

from collections import UserString
from typing import Any

import pytest

from evoharness.harness.tracing.masking import Masker, _key_kind


class _Str(str):
    pass


class _Dict(dict[Any, Any]):
    pass


def _reference(masker: Masker, value: Any) -> Any:
    """The walk as it was before the fast paths: isinstance checks, one call per item."""
    if isinstance(value, str):
        return masker.text(value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            kind = _key_kind(k) if isinstance(k, str) else None
            out[k] = (
                _reference(masker, v)
                if kind is None or v is None or isinstance(v, bool)
                else masker._item(k, v)
            )
        return out
    if isinstance(value, list | tuple):
        return [_reference(masker, v) for v in value]
    return value


SECRET = "sk-proj-" + "A1b2C3d4E5f6G7h8J9k0L1m2N3o4P5q6"
PAYLOADS: list[Any] = [
    "plain text",
    f"key {SECRET} here",
    {"role": "ai", "content": f"mail bob@example.com, key {SECRET}", "n": 3, "ok": True},
    {"api_key": "hunter2-long-secret-value", "password": 12345, "token": "abcdefghijkl"},
    {"phone": "+1 415 555 0100", "email": "x@y.org", "tel": 4155550100, "x": None},
    {"tool_calls": [{"id": "c1", "name": "ship", "args": {"item": "i1", "pw": None}}]},
    [("a", 1), {3: "int key", 4.5: SECRET}, None, 2.5, False],
    {_Str("authorization"): _Str(f"Bearer {SECRET}"), "nested": _Dict(k=_Str("call 415-555-0100"))},
    {"obj": UserString("x"), "b": b"bytes", "big": "word " * 5000},
    (SECRET, [SECRET, {"secret": True}]),
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_walk_masks_what_the_plain_walk_masks(payload: Any) -> None:
    masker = Masker()
    assert masker(payload) == _reference(masker, payload)


def test_walk_masks_secrets_and_pii_under_every_container() -> None:
    out = Masker()(PAYLOADS[2])
    assert SECRET not in out["content"] and "bob@example.com" not in out["content"]
    assert out["n"] == 3 and out["ok"] is True
    keyed = Masker()(PAYLOADS[3])
    assert keyed == {
        "api_key": "[masked:secret]",
        "password": "[masked:secret]",
        "token": "[masked:secret]",
    }
