"""Mask secrets and configured PII before anything is stored or exported.

Two kinds of rule run over every string a trace stores:

* **secrets**, always: provider keys by their published formats (OpenAI, Anthropic, Langfuse,
  AWS, GitHub, GitLab, Slack, Stripe, Google, Hugging Face, npm), JWTs, PEM private keys,
  ``Authorization`` headers and bare ``Bearer``/``Basic`` credentials, ``key = value``
  assignments whose key names a secret (``password=``, ``api_key:``, ``"client_secret": "…"``
  inside JSON text), and the password of a URL or connection string
  (``postgres://user:pw@host``);
* **PII**, as configured (default: email, phone, credit card).

The patterns are built to leave ordinary data alone (dates, ISO timestamps, times, floats,
numbers, UUIDs, hex digests, ids, version strings): a phone number needs a leading ``+``, the
North-American ``(555) 123-4567`` / ``555-123-4567`` grouping or a phone-named key; a card
number needs a card's length, grouping and issuer prefix and must pass the Luhn check; a
provider key must have the shape of one. :mod:`evoharness.harness.tracing.mask_corpus` holds
the values the tests hold them to.

Every rule runs in time linear in the text: a pattern can only start where its token starts
(a lookbehind of its own character class, placed after a leading literal so the engine can
search for the literal) and every repetition that could rescan text is bounded, so a
megabyte of hyphenated text costs one pass per rule, not one per starting position. Rules
are skipped when the text lacks their literal (``://``, ``@``, ``sk-``...); case-insensitive
rules run case-sensitively over the lowercased text (far faster in :mod:`re`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from evoharness.harness.errors import ConfigError

_T = r"A-Za-z0-9_\-"  # the character class of most key tokens


def _lead(first: str, body: str, before: str = _T) -> str:
    """``first`` + ``body``, matching only where ``first`` is not preceded by ``before``.

    ``first`` (a fixed-width regex) comes first so the engine can search for it quickly;
    the lookbehind then rejects a start inside a longer token, which also keeps the scan
    linear (a failed attempt never restarts inside the same token).
    """
    return f"{first}(?<![{before}]{first}){body}"


_PHONE_KEYS = r"(?:phone|mobile|cell|cellphone|tel|telephone|fax)(?:[_-]?(?:number|no))?"
_SEP = r"(?P<kq>\\?[\"']?)\s{0,5}(?P<sep>=>|:|=)\s{0,5}"
_SECRET_VALUE = (
    r"(?:\"(?P<dq>(?:[^\"\\\r\n]|\\.){1,1024})\"|'(?P<sq>[^'\r\n]{1,1024})'"
    r"|\\\"(?P<eq>[^\"\\\r\n]{1,1024})\\\"|(?P<bare>[^\s\"'\\,;&<>{}\[\]()]{1,1024}))"
)

# Secrets are always masked; they are never configuration. Order matters: specific first.
# Each kind has one or more patterns (each led by a literal where possible: the engine
# searches for a literal far faster than it tries a pattern at every position). Kinds in
# _FOLDED run over the lowercased text (their patterns are written in lower case).
SECRET_PATTERNS: dict[str, tuple[str, ...]] = {
    "private_key": (
        r"-----BEGIN[A-Z ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]{0,16384}?-----END[A-Z ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"|[A-Za-z0-9+/=\s]{0,16384})",
    ),
    # only the password of scheme://user:password@host is replaced
    "connection_password": (
        r"://(?<=[A-Za-z0-9]://)[^\s:/@?#\"'<>]{0,256}:(?P<v>[^\s@/?#\"'<>]{1,256})@",
    ),
    "authorization": (
        r"authorization\\?[\"']?\s{0,5}[:=]\s{0,5}\\?[\"']?"
        r"(?:(?:bearer|token|basic|digest|apikey|api-key|key|sso-key|negotiate|"
        r"aws4-hmac-sha256)\s{1,5})?(?P<v>[^\s\"'\\,;]{1,4096})",
    ),
    # key = value where the key names a secret (the whole key is checked against
    # SECRET_KEYS, as mapping keys are): one pattern per word a secret key ends with
    "secret_assignment": tuple(
        f"(?P<k>{word}){_SEP}{_SECRET_VALUE}"
        for word in ("key", "secret", "pass(?:word|wd|phrase)", "token", "credentials?")
    ),
    "anthropic_key": (_lead("sk-ant-", r"[A-Za-z0-9_-]{16,}"),),
    "openai_key": (
        _lead(
            "sk-",
            r"(?:(?:proj|svcacct|admin)-[A-Za-z0-9_-]{16,}|[A-Za-z0-9]{20,}(?![A-Za-z0-9_-]))",
        ),
    ),
    # led by "k-": the span is widened to the p/s before it
    "langfuse_key": (r"k-lf-(?<=[ps]k-lf-)(?<![A-Za-z0-9_\-][ps]k-lf-)[A-Za-z0-9-]{8,}",),
    "aws_access_key": (
        _lead(
            "A(?:KIA|SIA|BIA|CCA|GPA|IDA|ROA|IPA|NPA|NVA|PKA)",
            r"[A-Z0-9]{16}(?![A-Za-z0-9])",
            before="A-Za-z0-9",
        ),
    ),
    "github_token": (
        _lead("gh[pousr]_", r"[A-Za-z0-9]{30,}"),
        _lead("github_pat_", r"[A-Za-z0-9_]{22,}"),
    ),
    "gitlab_token": (_lead("glpat-", r"[A-Za-z0-9_-]{20,}"),),
    "slack_token": (_lead("xox[abposr]-", r"[A-Za-z0-9-]{10,}"),),
    "stripe_key": (
        r"k_(?:live|test)_(?<=[sr]k_(?:live|test)_)(?<![A-Za-z0-9_][sr]k_(?:live|test)_)"
        r"[A-Za-z0-9]{16,}",
        _lead("whsec_", r"[A-Za-z0-9]{24,}"),
    ),
    "google_api_key": (_lead("AIza", r"[A-Za-z0-9_-]{35}"),),
    "huggingface_token": (_lead("hf_", r"[A-Za-z0-9]{30,}"),),
    "npm_token": (_lead("npm_", r"[A-Za-z0-9]{36}"),),
    "jwt": (_lead("eyJ", r"[A-Za-z0-9_-]{6,}\.eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*", _T + "."),),
    "bearer_token": (_lead("bearer", r"\s{1,5}(?P<v>[a-z0-9._~+/=-]{16,4096})", "a-z0-9"),),
    "basic_auth": (_lead("basic", r"\s{1,5}(?P<v>[a-z0-9+/]{8,4096}={0,2})", "a-z0-9"),),
}
PII_PATTERNS: dict[str, tuple[str, ...]] = {
    # the domain; the local part is found by scanning back from the "@" (at most 64 chars)
    "email": (r"@(?:[A-Za-z0-9-]{1,63}\.){1,8}[A-Za-z]{2,24}(?![A-Za-z0-9-])",),
    "phone": (
        # international: + and 8-15 digits separated by spaces, hyphens or parentheses
        _lead(r"\+", r"(?:\d[ ()-]{0,2}){7,14}\d(?!\w|[.,]\d)", r"\w+"),
        # (555) 123-4567; 555-123-4567 is found inside digit runs (see _NUMBER)
        _lead(r"\(", r"\d{3}\) ?\d{3}[-. ]\d{4}(?![\w-]|\.\d)", r"\w.+/-"),
        # the value of a phone-named key (lowercased text; the whole key is checked)
        *(
            f"(?P<k>{word}(?:[_-]?(?:number|no))?)\\\\?[\"']?\\s{{0,5}}[:=]\\s{{0,5}}\\\\?[\"']?"
            r"(?P<v>\+?\d[\d ()./-]{5,22}\d)"
            for word in ("phone", "mobile", "cell", "tel", "fax")
        ),
    ),
    # searched inside runs of digits (see _NUMBER), like 555-123-4567
    "credit_card": (r"(?<![\w.+-])\d(?:[ -]?\d){12,18}(?!\w|[.,-]\d)",),
    "us_ssn": (r"(?<![\w-])\d{3}-\d{2}-\d{4}(?![\w-])",),
    "ipv4": (
        r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}"
        r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\w]|\.\d)",
    ),
}
_NANP = re.compile(r"(?<![\w.+/-])\d{3}([-. ])\d{3}\1\d{4}(?![\w-]|\.\d)")
# Runs of digits and separators, found once and then searched for cards and phone numbers
# (a digit-led pattern costs a lot when a third of the text is digits; one pass, not two).
_SHAPE = re.compile(r"\d{4}[ -]?\d{4}|\d{3}[-. ]\d{3}[-. ]\d{4}")
_NUMBER = re.compile(_lead(r"\d", r"(?:[ .-]?\d){9,}", r"\w.+-"))
DEFAULT_PII = ("email", "phone", "credit_card")

# Rules skip texts without one of these (in the lowercased text for folded rules).
_NEEDLES: dict[str, tuple[str, ...]] = {
    "private_key": ("PRIVATE KEY",),
    "connection_password": ("://",),
    "authorization": ("authorization",),
    "secret_assignment": ("key", "secret", "pass", "token", "credential"),
    "anthropic_key": ("sk-ant-",),
    "openai_key": ("sk-",),
    "langfuse_key": ("k-lf-",),
    "github_token": ("gh", "github_pat_"),
    "gitlab_token": ("glpat-",),
    "slack_token": ("xox",),
    "stripe_key": ("_live_", "_test_", "whsec_"),
    "google_api_key": ("AIza",),
    "huggingface_token": ("hf_",),
    "npm_token": ("npm_",),
    "jwt": ("eyJ",),
    "bearer_token": ("bearer",),
    "basic_auth": ("basic",),
    "email": ("@",),
    "phone": ("+", "(", "phone", "mobile", "cell", "tel", "fax"),
}
_FOLDED = {"authorization", "secret_assignment", "bearer_token", "basic_auth", "phone"}

SECRET_KEYS = re.compile(
    r"(?i)^(?:.*[_-])?(?:api[_-]?key|apikey|secret(?:[_-]?(?:access[_-]?)?key)?|password|"
    r"passwd|passphrase|private[_-]?key|client[_-]?secret|(?:access|auth|refresh|id|session|"
    r"bearer|csrf)[_-]?token|authorization|credentials?)$"
)
"""Mapping keys whose values are masked whatever they look like."""
_TOKEN_KEY = re.compile(r"(?i)^token$")  # page_token, next_token...: opaque, not secret
_PHONE_KEY = re.compile(rf"(?i)^(?:.*[_-])?{_PHONE_KEYS}$")
_EMAIL_KEY = re.compile(r"(?i)^(?:.*[_-])?e?-?mail(?:[_-]?address)?$")
_HASHED = re.compile(r"hmac:[0-9a-f]{32}")
_NOT_SECRET = frozenset({"", "null", "none", "true", "false", "undefined", "***", "<redacted>"})
_LOCAL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")
_WORD = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")

_CACHE_MAX_CHARS = 16_384  # longer texts are masked every time rather than held
_FAST_MAX_CHARS = 1_024  # longer texts nearly always hold a needle: the pre-scan is only a cost

Span = tuple[int, int, str]
"""A replacement: start, end (in the original text) and the text that replaces it."""


# -- checks: which candidate matches are real, and what they replace ---------------------------
def _digits(text: str) -> str:
    return "".join(c for c in text if c.isdigit())


def _luhn(number: str) -> bool:
    total = 0
    for i, c in enumerate(reversed(number)):
        d = ord(c) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_issuer(number: str) -> bool:
    """Whether the number has the length and prefix of a real card brand."""
    n, two, three, four = len(number), int(number[:2]), int(number[:3]), int(number[:4])
    if number[0] == "4":  # Visa
        return n in (13, 16, 19)
    if 51 <= two <= 55 or 2221 <= four <= 2720:  # Mastercard
        return n == 16
    if two in (34, 37):  # American Express
        return n == 15
    if four == 6011 or two == 65 or 644 <= three <= 649:  # Discover
        return 16 <= n <= 19
    if 3528 <= four <= 3589:  # JCB
        return 16 <= n <= 19
    if two in (36, 38, 39) or 300 <= three <= 305:  # Diners Club
        return 14 <= n <= 19
    return False


_CARD_GROUPS = ([4, 4, 4, 4], [4, 6, 5], [4, 6, 4], [4, 4, 4, 4, 3])


def is_card_number(text: str) -> bool:
    """Whether ``text`` is written like a payment card number and is one.

    Contiguous digits must be 15 or 16 long; separated ones grouped 4-4-4-4, 4-6-5, 4-6-4 or
    4-4-4-4-3 with one kind of separator; the issuer prefix must fit the length and the
    Luhn check must pass (an order id that looks like a card fails one of these).
    """
    number = _digits(text)
    if len(text) == len(number):
        if len(number) not in (15, 16):
            return False
    elif (
        len({c for c in text if not c.isdigit()}) != 1
        or [len(g) for g in re.split(r"[ -]", text)] not in _CARD_GROUPS
    ):
        return False
    return 13 <= len(number) <= 19 and _card_issuer(number) and _luhn(number)


def _credential(value: str) -> bool:
    return value.lower() not in _NOT_SECRET and not value.startswith(("[masked:", "${", "{{"))


def _inside_word(src: str, start: int) -> bool:
    return start > 0 and src[start - 1].lower() in _WORD


def _value(label: str) -> Callable[[re.Match[str], str], list[Span]]:
    """Replace group ``v`` (when it is a credential)."""

    def spans(m: re.Match[str], src: str) -> list[Span]:
        start, end = m.span("v")
        return [(start, end, label)] if _credential(src[start:end]) else []

    return spans


def _authorization(m: re.Match[str], src: str) -> list[Span]:
    return [] if _inside_word(src, m.start()) else _value("[masked:authorization]")(m, src)


def _key_start(low: str, end: int) -> int:
    """Where the key token that ends at ``end`` starts (letters, digits, ``_``, ``-``)."""
    start = end
    while start > 0 and end - start < 64 and (low[start - 1] in _WORD or low[start - 1] in "_-"):
        start -= 1
    return start


def _assignment(m: re.Match[str], src: str) -> list[Span]:
    key_end = m.end("k")
    key = m.string[_key_start(m.string, m.start("k")) : key_end]  # m.string: lowercased
    token = _TOKEN_KEY.fullmatch(key) is not None
    if not token and SECRET_KEYS.fullmatch(key) is None:
        return []  # max_tokens, next_page_token, dbpassword: not a secret's key
    name = m.lastgroup or "bare"
    start, end = m.span(name)
    value = src[start:end]
    if not _credential(value) or (token and (len(value) < 8 or value.isdigit())):
        return []  # token: 512 is a count
    label = "[masked:secret]"
    if name == "bare" and m.group("kq") and m.group("sep") == ":":
        label = f'"{label}"'  # a JSON number or literal: keep the document valid
    return [(start, end, label)]


def _widened(label: str) -> Callable[[re.Match[str], str], list[Span]]:
    """The whole match, plus the character before a match led by ``k`` (``pk-lf-``)."""

    def spans(m: re.Match[str], src: str) -> list[Span]:
        return [(m.start() - (m.group(0)[0] == "k"), m.end(), label)]

    return spans


def _bearer(m: re.Match[str], src: str) -> list[Span]:
    start, end = m.span("v")
    ok = any(c.isdigit() for c in src[start:end])  # "Bearer instruments" is prose
    return [(start, end, "[masked:bearer_token]")] if ok else []


def _basic(m: re.Match[str], src: str) -> list[Span]:
    start, end = m.span("v")
    try:
        ok = b":" in base64.b64decode(src[start:end], validate=True)  # user:password
    except (binascii.Error, ValueError):
        ok = False
    return [(start, end, "[masked:basic_auth]")] if ok else []


def _email(m: re.Match[str], src: str) -> list[Span]:
    at = m.start()
    start = at
    while start > 0 and at - start <= 64 and src[start - 1] in _LOCAL:
        start -= 1
    local = src[start:at]
    if not local or at - start > 64 or local in ("git", "hg"):
        return []
    tld = m.group(0).rsplit(".", 1)[-1].lower()
    if tld in {"png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "pdf", "json", "txt"}:
        return []  # icon@2x.png is a file name
    return [(start, m.end(), "[masked:email]")]


def _phone(m: re.Match[str], src: str) -> list[Span]:
    if m.re.groupindex.get("v"):  # a phone-named key
        key = m.string[_key_start(m.string, m.start("k")) : m.end("k")]
        start, end = m.span("v")
        n = len(_digits(src[start:end]))
        ok = _PHONE_KEY.fullmatch(key) is not None and 7 <= n <= 15
        return [(start, end, "[masked:phone]")] if ok else []
    text = m.group(0)
    if text[0] != "+":
        return [(m.start(), m.end(), "[masked:phone]")]  # (555) 123-4567
    n = len(_digits(text))
    ok = 10 <= n <= 15 if text[1:].isdigit() else 8 <= n <= 15  # +12345678 may be a number
    return [(m.start(), m.end(), "[masked:phone]")] if ok else []


def _ssn(m: re.Match[str], src: str) -> list[Span]:
    area, group, serial = m.group(0).split("-")
    ok = area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"
    return [(m.start(), m.end(), "[masked:us_ssn]")] if ok else []


def _numbers(cards: bool, phones: bool) -> Callable[[re.Match[str], str], list[Span]]:
    """Cards and North-American phone numbers inside one run of digits and separators."""
    card_rx = re.compile(PII_PATTERNS["credit_card"][0])

    def spans(m: re.Match[str], src: str) -> list[Span]:
        if not _SHAPE.search(m.group(0)):
            return []  # most runs are dates and times: no 4-4 or 3-3-4 grouping
        lo, hi = max(m.start() - 1, 0), min(m.end() + 1, len(src))
        window = src[lo:hi]  # one character of context each side, for the lookarounds
        found: list[Span] = []
        if cards:
            found += [
                (lo + c.start(), lo + c.end(), "[masked:credit_card]")
                for c in card_rx.finditer(window)
                if is_card_number(c.group(0))
            ]
        if phones:
            taken = [(s, e) for s, e, _ in found]
            found += [
                (lo + p.start(), lo + p.end(), "[masked:phone]")
                for p in _NANP.finditer(window)
                if not any(s < lo + p.end() and lo + p.start() < e for s, e in taken)
            ]
        return sorted(found)

    return spans


_SPANS: dict[str, Callable[[re.Match[str], str], list[Span]]] = {
    "connection_password": _value("[masked:connection_password]"),
    "authorization": _authorization,
    "secret_assignment": _assignment,
    "langfuse_key": _widened("[masked:langfuse_key]"),
    "stripe_key": _widened("[masked:stripe_key]"),
    "bearer_token": _bearer,
    "basic_auth": _basic,
    "email": _email,
    "phone": _phone,
    "us_ssn": _ssn,
}


@dataclass(frozen=True)
class _Rule:
    name: str
    regex: re.Pattern[str]
    spans: Callable[[re.Match[str], str], list[Span]] | None  # None: the whole match
    label: str
    needles: tuple[str, ...]
    folded: bool
    keyed: Callable[[str, str], str] | None = None  # (label, matched text) -> token

    def apply(self, text: str, hay: str) -> str:
        """``text`` with this rule's matches replaced; ``hay`` is what the regex searches
        (``text`` itself, or ``text`` lowercased with the same length)."""
        out: list[str] = []
        pos = 0
        for m in self.regex.finditer(hay):
            found = (
                [(m.start(), m.end(), self.label)] if self.spans is None else self.spans(m, text)
            )
            for start, end, label in found:
                if start < pos:
                    continue  # overlaps what an earlier match replaced
                out.append(text[pos:start])
                out.append(label if self.keyed is None else self.keyed(label, text[start:end]))
                pos = end
        if not out:
            return text
        out.append(text[pos:])
        return "".join(out)


@functools.lru_cache(maxsize=4096)
def _key_kind(key: str) -> str | None:
    if SECRET_KEYS.search(key):
        return "secret"
    if _TOKEN_KEY.search(key):
        return "token"
    if _PHONE_KEY.search(key):
        return "phone"
    if _EMAIL_KEY.search(key):
        return "email"
    return None


@dataclass
class Masker:
    """Replaces secrets (always) and the configured PII kinds with ``[masked:<kind>]``.

    Also masks the value of any mapping key that names a secret (``api_key``, ``password``,
    ``authorization``...), whatever it looks like, and of keys named after a configured PII
    kind (``phone``, ``email``). User and session ids go through :meth:`identifier`.

    Args:
        pii: PII kinds to mask: ``email``, ``phone``, ``credit_card`` (the default), and
            ``us_ssn``, ``ipv4`` (off by default).
        extra: Additional ``name -> regex`` patterns, masked as ``[masked:<name>]``.
        id_key: Secret key for :meth:`identifier`: ids that hold PII (or all ids, with
            ``hash_ids``) become ``hmac:<32 hex>``, the same for the same id and key, so
            one user's traces stay together without storing who the user is. Without a
            key such ids are masked like any other text.
        hash_ids: Hash every user/session id, not only those that hold PII (needs
            ``id_key``).
        pii_key: A deployment key for PII tokens: with it each configured PII value becomes
            ``[<kind>:<8 hex>]`` (HMAC-SHA256 of the normalised value: an email lowercased,
            a phone or card number as its digits), the same token for the same value and
            key, so an app's checker can still compare a stored value with a real one
            (:meth:`matches`) without the value being stored. Secrets are always masked as
            ``[masked:<kind>]``. Keep the key out of traces and code (an environment
            variable such as ``EVOHARNESS_PII_KEY``, read by the app at start-up).

    Raises:
        ConfigError: An unknown PII kind, an ``extra`` pattern that does not compile, or
            ``hash_ids`` without ``id_key``.

    Example:
        >>> Masker().text("login with password=hunter2 on 2024-05-26")
        'login with password=[masked:secret] on 2024-05-26'
    """

    pii: Iterable[str] = DEFAULT_PII
    extra: dict[str, str] = field(default_factory=dict)
    id_key: str | bytes | None = field(default=None, repr=False)
    hash_ids: bool = False
    pii_key: str | bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.pii = tuple(self.pii)
        unknown = set(self.pii) - set(PII_PATTERNS)
        if unknown:
            raise ConfigError(
                f"unknown PII kinds {sorted(unknown)}; known: {sorted(PII_PATTERNS)}", field="pii"
            )
        if self.hash_ids and not self.id_key:
            raise ConfigError("hash_ids=True needs an id_key to hash with", field="id_key")
        self._key = self.id_key.encode() if isinstance(self.id_key, str) else self.id_key
        self._pii_key = (
            self.pii_key.encode() if isinstance(self.pii_key, str) else self.pii_key
        ) or None
        keyed = self._keyed if self._pii_key is not None else None
        kinds = {**SECRET_PATTERNS, **{k: PII_PATTERNS[k] for k in self.pii}}
        rules = [
            _Rule(
                kind,
                re.compile(rx),
                _SPANS.get(kind),
                f"[masked:{kind}]",
                _NEEDLES.get(kind, ()),
                kind in _FOLDED,
                keyed if kind in PII_PATTERNS else None,
            )
            for kind, patterns in kinds.items()
            if kind != "credit_card"  # found inside digit runs, with North-American phones
            for rx in patterns
        ]
        if "credit_card" in self.pii or "phone" in self.pii:
            numbers = _numbers("credit_card" in self.pii, "phone" in self.pii)
            rules.append(_Rule("numbers", _NUMBER, numbers, "", (), False, keyed))
        for name, rx in self.extra.items():
            try:
                compiled = re.compile(rx)
            except re.error as exc:
                raise ConfigError(
                    f"extra pattern {name!r} does not compile: {exc}", field="extra"
                ) from exc
            rules.append(_Rule(name, compiled, None, f"[masked:{name}]", (), False))
        self._rules = rules
        # The fast path: a string where no rule's needle occurs can only be changed by the
        # rules without needles (``_bare``); one literal alternation per case finds any needle
        # in a single scan, exactly like the per-rule ``n in hay`` checks.
        self._bare = [r for r in rules if not r.needles]
        plain = sorted({n for r in rules if not r.folded for n in r.needles})
        folded = sorted({n for r in rules if r.folded for n in r.needles})
        self._plain_needles = re.compile("|".join(map(re.escape, plain))) if plain else None
        self._folded_needles = re.compile("|".join(map(re.escape, folded))) if folded else None
        self._pii_keys = {k for k in ("phone", "email") if k in self.pii}
        # A generation records the whole conversation so far, so each message's text is
        # masked again on every later call; the cache makes that a lookup (the same string
        # objects come back, with their hash already computed).
        self._cached = functools.lru_cache(maxsize=4096)(self._mask)
        self._ids = functools.lru_cache(maxsize=4096)(self._identifier)

    def _mask(self, value: str) -> str:
        if len(value) <= _FAST_MAX_CHARS and self._unchanged(value):
            return value
        low: str | None = None
        for rule in self._rules:
            hay = value
            if rule.folded:
                if low is None:
                    low = value.lower()
                    if len(low) != len(value):  # a few non-ASCII letters change length
                        low = value.encode("ascii", "replace").decode().lower()
                hay = low
            if rule.needles and not any(n in hay for n in rule.needles):
                continue
            new = rule.apply(value, hay)
            if new is not value:
                value, low = new, None
        return value

    def _unchanged(self, value: str) -> bool:
        """True when no rule can change ``value``: no needle occurs in it (so the full pass
        skips every rule that has needles, ``value`` staying as it is) and no rule without
        needles matches it."""
        if self._plain_needles is not None and self._plain_needles.search(value):
            return False
        if self._folded_needles is not None:
            low = value.lower()
            if len(low) != len(value):  # as in the full pass
                low = value.encode("ascii", "replace").decode().lower()
            if self._folded_needles.search(low):
                return False
        return not any(rule.regex.search(value) for rule in self._bare)

    def text(self, value: str) -> str:
        """Mask one string."""
        return self._cached(value) if len(value) <= _CACHE_MAX_CHARS else self._mask(value)

    def __call__(self, value: Any) -> Any:
        """Mask strings anywhere inside ``value`` (dicts, lists, tuples), returning a copy."""
        # exact types first: every stored payload is walked here (a large part of the
        # writer's per-record cost); subclasses take the general checks below
        cls = type(value)
        if cls is str:
            return self._cached(value) if len(value) <= _CACHE_MAX_CHARS else self._mask(value)
        if cls is dict:
            return self._dict(value)
        if cls is list:
            return [self(v) for v in value]
        if cls is int or cls is float or value is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return self._dict(value)
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        return value

    def _dict(self, value: dict[Any, Any]) -> dict[Any, Any]:
        """A mapping with its values masked (:meth:`_item`); the common value under a key
        that names nothing (a short string, a number) is handled in the loop, without a
        call per key."""
        out: dict[Any, Any] = {}
        cached = self._cached
        for key, item in value.items():
            if isinstance(key, str) and _key_kind(key) is not None:
                out[key] = self._item(key, item)
                continue
            cls = type(item)
            if cls is str:
                out[key] = cached(item) if len(item) <= _CACHE_MAX_CHARS else self._mask(item)
            elif cls is int or cls is float or cls is bool or item is None:
                out[key] = item
            else:
                out[key] = self(item)
        return out

    def _item(self, key: Any, value: Any) -> Any:
        kind = _key_kind(key) if isinstance(key, str) else None
        if kind is None:
            return self(value)
        if value is None or isinstance(value, bool):
            return self(value)
        if kind == "secret" and isinstance(value, str | int | float):
            return value if isinstance(value, str) and not _credential(value) else "[masked:secret]"
        if kind == "token" and isinstance(value, str):
            keep = len(value) < 8 or value.isdigit() or not _credential(value)
            return self.text(value) if keep else "[masked:secret]"
        if kind in self._pii_keys and isinstance(value, str | int):
            text = str(value)
            if kind == "phone" and 7 <= len(_digits(text)) <= 15:
                return self.token("phone", text)
            if kind == "email" and "@" in text:
                return self.token("email", text)
        return self(value)

    def token(self, kind: str, value: str) -> str:
        """What a PII value of ``kind`` is stored as: ``[<kind>:<8 hex>]`` with a
        ``pii_key``, else ``[masked:<kind>]``."""
        if self._pii_key is None:
            return f"[masked:{kind}]"
        norm = _digits(value) if kind in ("phone", "credit_card", "us_ssn") else value
        mac = hmac.new(self._pii_key, f"{kind}|{norm.strip().lower()}".encode(), hashlib.sha256)
        return f"[{kind}:{mac.hexdigest()[:8]}]"

    def _keyed(self, label: str, found: str) -> str:
        kind = label[len("[masked:") : -1] if label.startswith("[masked:") else ""
        return self.token(kind, found) if kind in PII_PATTERNS else label

    def matches(self, real: Any, stored: Any) -> bool:
        """Whether ``stored`` (a value as a trace holds it) is what ``real`` is stored as:
        for an app's checker comparing, say, ``args["to"]`` with the order's email.

        With a ``pii_key`` the comparison is exact up to normalisation (case of an email,
        punctuation of a phone number); without one every email masks to the same
        ``[masked:email]``, so this only says both are emails — configure a ``pii_key``
        for checkers that compare PII.

        Example:
            >>> m = Masker(pii_key="deployment-key")
            >>> stored = m.text("mail ann@example.com")
            >>> m.matches("mail Ann@Example.com", stored), m.matches("mail bob@example.com", stored)
            (True, False)
        """
        return bool(self(real) == stored)

    def identifier(self, value: object) -> str | None:
        """A user or session id as it may be stored: a string, with PII masked or hashed.

        ``None`` stays ``None``; other values become their ``str`` (an ``int`` user id is a
        valid id). An id that holds a secret or configured PII (an email, a phone number)
        becomes ``hmac:<32 hex>`` with an ``id_key`` (HMAC-SHA256, the same for the same id
        and key, so grouping by user keeps working) and is masked like text without one.
        With ``hash_ids`` every id is hashed. Already-hashed ids are returned unchanged.
        """
        if value is None:
            return None
        return self._ids(value if isinstance(value, str) else str(value))

    def _identifier(self, value: str) -> str:
        if _HASHED.fullmatch(value):
            return value
        masked = self.text(value)
        if not self.hash_ids and masked == value:
            return value
        if self._key is None:
            return masked
        return "hmac:" + hmac.new(self._key, value.encode(), hashlib.sha256).hexdigest()[:32]
