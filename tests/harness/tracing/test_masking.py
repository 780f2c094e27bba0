"""Masking: no false positives on ordinary data, every secret masked, linear time."""

from __future__ import annotations

import json
import pickle
import re
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

import pytest

from evoharness.harness.errors import ConfigError
from evoharness.harness.tracing.mask_corpus import SAFE_VALUES, SECRET_VALUES, masking_benchmark
from evoharness.harness.tracing.masking import (
    PII_PATTERNS,
    SECRET_PATTERNS,
    Masker,
    is_card_number,
)

MASKER = Masker()


# -- the corpus ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", SAFE_VALUES)
def test_safe_values_are_left_alone(value: str) -> None:
    assert MASKER.text(value) == value


@pytest.mark.parametrize(("text", "secret"), SECRET_VALUES)
def test_secrets_are_masked(text: str, secret: str) -> None:
    masked = MASKER.text(text)
    assert secret not in masked
    assert "[masked:" in masked


def test_safe_values_survive_inside_json_and_prose() -> None:
    document = json.dumps({f"field_{i}": v for i, v in enumerate(SAFE_VALUES)})
    assert MASKER.text(document) == document
    prose = " ".join(f"({v})" for v in SAFE_VALUES)
    assert MASKER.text(prose) == prose


def test_structured_values_are_unchanged_except_secrets() -> None:
    args = {
        "date": "2024-05-26",
        "ts": "2024-05-26T10:00:00.123+00:00",
        "price": 26.123456789,
        "qty": 3,
        "order": "ORD-2024-000123",
        "sha": "9fceb02d0ae598e95dc970b74767f19372d61af8",
        "max_tokens": 256,
        "next_page_token": "CiAKGjBpNDd2Nmp2Zml2cXRiZ2V0",
        "ok": True,
        "nothing": None,
    }
    assert MASKER(args) == args
    secret = {
        "password": 12345678,
        "db": {"client_secret": "abc", "api_key": ""},
        "token": "opaque-credential-123",
        "phone": "06 12 34 56 78",
        "email": "bob at example dot com @ home",
        "items": [("x", "sk-ant-abcdefghijklmnopqrs")],
    }
    assert MASKER(secret) == {
        "password": "[masked:secret]",
        "db": {"client_secret": "[masked:secret]", "api_key": ""},
        "token": "[masked:secret]",
        "phone": "[masked:phone]",
        "email": "[masked:email]",
        "items": [["x", "[masked:anthropic_key]"]],
    }


def test_json_text_stays_valid_json() -> None:
    text = json.dumps({"user": "bob", "password": 123456, "api_key": "k-1", "n": 2.5})
    masked = MASKER.text(text)
    assert json.loads(masked) == {
        "user": "bob",
        "password": "[masked:secret]",
        "api_key": "[masked:secret]",
        "n": 2.5,
    }


def test_connection_string_keeps_everything_but_the_password() -> None:
    masked = MASKER.text("dsn postgres://app:pa55word@db.internal:5432/app?sslmode=require")
    assert masked == (
        "dsn postgres://app:[masked:connection_password]@db.internal:5432/app?sslmode=require"
    )


def test_cards_need_luhn_issuer_and_grouping() -> None:
    assert is_card_number("4111111111111111")
    assert is_card_number("4111 1111 1111 1111")
    assert is_card_number("3782 822463 10005")  # Amex 4-6-5
    assert not is_card_number("4111111111111112")  # Luhn fails
    assert not is_card_number("1111111111111117")  # passes Luhn, no issuer starts with 1
    assert not is_card_number("41 11111111 111111")  # not a card's grouping
    assert not is_card_number("4111-1111 1111-1111")  # two separator kinds
    assert not is_card_number("4111111111111")  # 13 contiguous digits: a number, not a card


def test_pii_kinds_are_configurable() -> None:
    assert Masker(pii=()).text("bob@example.com +44 20 7946 0958") == (
        "bob@example.com +44 20 7946 0958"
    )
    assert Masker(pii=("us_ssn",)).text("ssn 123-45-6789") == "ssn [masked:us_ssn]"
    assert Masker(pii=("ipv4",)).text("from 10.1.2.3.") == "from [masked:ipv4]."
    assert Masker(extra={"ticket": r"TICKET-\d+"}).text("TICKET-42") == "[masked:ticket]"
    with pytest.raises(ConfigError, match="unknown PII kinds") as info:
        Masker(pii=("dna",))
    assert pickle.loads(pickle.dumps(info.value)).field == "pii"
    with pytest.raises(ConfigError, match="does not compile"):
        Masker(extra={"bad": "("})


def test_identifiers_are_strings_masked_or_keyed_hashes() -> None:
    assert MASKER.identifier(None) is None
    assert MASKER.identifier(42) == "42"
    assert MASKER.identifier("user-42") == "user-42"
    assert MASKER.identifier("bob@example.com") == "[masked:email]"
    keyed = Masker(id_key="k1")
    first = keyed.identifier("bob@example.com")
    assert first is not None and re.fullmatch(r"hmac:[0-9a-f]{32}", first)
    assert keyed.identifier("bob@example.com") == first  # consistent
    assert Masker(id_key="k1").identifier("bob@example.com") == first  # across instances
    assert Masker(id_key="k2").identifier("bob@example.com") != first  # keyed
    assert keyed.identifier("alice@example.com") != first
    assert keyed.identifier(first) == first  # hashing twice changes nothing
    assert keyed.identifier("user-42") == "user-42"  # not PII: kept
    everything = Masker(id_key=b"k1", hash_ids=True)
    assert everything.identifier("user-42") != "user-42"
    assert everything.identifier("bob@example.com") == first
    with pytest.raises(ConfigError, match="id_key"):
        Masker(hash_ids=True)


def test_benchmark_reports_corpus_counts_and_speed() -> None:
    result = masking_benchmark(size=50_000)
    assert result["mask_false_positives"] == 0
    assert result["mask_missed_secrets"] == 0
    assert result["mask_mb_per_s"] > 0


# -- linear time ---------------------------------------------------------------------------------
_REPEATS = {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT}


def _nested_unbounded(items: Any, inside: bool = False) -> bool:
    """Whether an unbounded repetition sits inside a repetition that can repeat."""
    for op, av in items:
        if op in _REPEATS:
            _low, high, sub = av
            if inside and high == sre_constants.MAXREPEAT:
                return True
            if _nested_unbounded(sub, inside or high > 1):
                return True
            continue
        for part in av if isinstance(av, tuple | list) else [av]:
            subs = part if isinstance(part, list) else [part]
            for sub in subs:
                if isinstance(sub, sre_parse.SubPattern) and _nested_unbounded(sub, inside):
                    return True
    return False


def _all_patterns() -> list[str]:
    return [
        rx for patterns in (SECRET_PATTERNS, PII_PATTERNS) for p in patterns.values() for rx in p
    ]


def test_audit_finds_nested_quantifiers() -> None:
    assert _nested_unbounded(sre_parse.parse(r"(a+)+b"))
    assert _nested_unbounded(sre_parse.parse(r"(?:x|(?:y*z){2,})"))
    assert not _nested_unbounded(sre_parse.parse(r"(?:\d[ -]{0,2}){7,14}\d"))


@pytest.mark.parametrize("pattern", _all_patterns())
def test_no_pattern_nests_unbounded_quantifiers(pattern: str) -> None:
    assert not _nested_unbounded(sre_parse.parse(pattern)), pattern


@pytest.mark.parametrize(
    "shape",
    [
        "a-" * 32_000,  # the 64K hyphenated token that took seconds before
        "1-" * 32_000,
        "1 " * 32_000,
        "sk-" * 21_000,
        "a@" * 32_000,
        "password" * 8_000,
        "+1 " * 21_000,
        "eyJ." * 16_000,
        "://a:" * 12_000,
        "(" * 64_000,
    ],
)
def test_adversarial_64k_inputs_are_left_alone(shape: str) -> None:
    assert "[masked:" not in MASKER.text(shape)


def test_many_secrets_in_one_text_are_all_masked() -> None:
    text = "password=x1 " * 20_000
    assert MASKER.text(text) == "password=[masked:secret] " * 20_000


def test_one_megabyte_inputs_complete() -> None:
    hyphenated = "-".join(["token"] * 170_000)[:1_000_000]
    assert MASKER.text(hyphenated) == hyphenated
    digits = "4" * 1_000_000
    assert MASKER.text(digits) == digits
    mixed = "\n".join(SAFE_VALUES * 200)[:1_000_000]
    masked = MASKER.text(mixed)
    assert len(masked) == len(mixed) and "[masked:" not in masked
