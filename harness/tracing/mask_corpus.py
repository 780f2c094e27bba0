"""The public masking corpus: what :class:`Masker` must leave alone and what it must mask.

``SAFE_VALUES`` are ordinary tool arguments and results (dates, timestamps, numbers, ids,
hashes, versions, card-like ids that fail the Luhn check, prose that mentions passwords and
tokens): masking must return each unchanged, or traces stop being replayable.
``SECRET_VALUES`` pairs a text with the secret inside it, in the formats providers publish:
masking must remove the secret. The tests hold :class:`Masker` to both lists and
``evoharness bench tracing`` reports :func:`masking_benchmark`.
"""

from __future__ import annotations

import time

from evoharness.harness.tracing.masking import Masker

SAFE_VALUES: list[str] = [
    # dates, times, timestamps
    "2024-05-26",
    "2024-05-26T10:00:00Z",
    "2024-05-26T10:00:00.123456+00:00",
    "2024-05-26 10:00:00",
    "2024-05-26T23:59:59-07:00",
    "26/05/2024",
    "05/26/2024 11:30 PM",
    "26.05.2024",
    "20240526",
    "20240526T100000Z",
    "10:00-11:30",
    "23:59:59.999",
    "Sun, 26 May 2024 10:00:00 GMT",
    "1716720000",
    "1716720000.123456",
    "1716720000123",
    "1716720000123456",
    "1716720000123456789",
    "shipping window 2024-05-26 to 2024-06-02",
    "2024-05-26 2024-05-27 2024-05-28",
    # numbers and amounts
    "26.123456789",
    "3.141592653589793",
    "-122.419416",
    "48.8566, 2.3522",
    "+3.5",
    "+12.75%",
    "1e-09",
    "6.02214076e23",
    "1234567890",
    "12345678901234",
    "4000000000000000",
    "9999999999999999",
    "$1,234,567.89",
    "EUR 1.234.567,89",
    "0.1234567890123456",
    "100000000000000000000",
    "-5551234567",
    "qty 12 34 56 78",
    # ids, hashes, versions
    "550e8400-e29b-41d4-a716-446655440000",
    "123e4567-e89b-12d3-a456-426614174000",
    "12345678-1234-1234-1234-123456789012",
    "01ARZ3NDEKTSV4RRFFQ69G5FAV",
    "d41d8cd98f00b204e9800998ecf8427e",
    "da39a3ee5e6b4b0d3255bfef95601890afd80709",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
    "a1b2c3d",
    "v1.2.3",
    "2.0.0-rc.1+build.20240526",
    "numpy>=1.26.4,<2",
    "lodash@4.17.21",
    "react@18",
    "ORD-2024-000123",
    "order 112-4567890-1234567",
    "SKU-4111-1111-1111",
    "INV-4111-1111-1111-1112",
    "4111 1111 1111 1112",
    "4111-1111-1111-1112",
    "5500 0000 0000 0005",
    "tracking 1Z999AA10123456784",
    "ISBN 978-3-16-148410-0",
    "arn:aws:iam::123456789012:role/agent",
    "ch_3MmlLrLkdIwHu7ix0snN0B15",
    "cus_NffrFeUfNV2Hib",
    "thread-7f9c2ba4e88f827d616045507605853e",
    "trace 4bf92f3577b34da6a3ce929d0e0e4736 span 00f067aa0ba902b7",
    "run bench-3-a1b2c3",
    "192.168.1.10",
    "10.0.0.1:8080",
    "fe80::1ff:fe23:4567:890a",
    "sk-learn-compatible-estimators-and-transformers",
    "task-runner-queue-5-priority-high",
    "risk-assessment-2024-05-26",
    "--max-tokens 4096 --top-p 0.95",
    "a-" * 40 + "z",
    # structured tool traffic
    '{"order_id": "ORD-2024-000123", "total": 129.99, "created_at": "2024-05-26T10:00:00Z"}',
    '{"items": [{"sku": "SKU-4111-1111", "qty": 2, "price": 19.5}], "currency": "EUR"}',
    '{"max_tokens": 256, "input_tokens": 1234, "output_tokens": 56, "total_tokens": 1290}',
    '{"next_page_token": "CiAKGjBpNDd2Nmp2Zml2cXRiZ2V0", "page_size": 50}',
    '{"lat": 48.8566, "lon": 2.3522, "radius_km": 12.5}',
    '{"token_count": 512, "tokenizer": "cl100k_base"}',
    "SELECT * FROM orders WHERE created_at > '2024-05-26' AND total > 100.00",
    "https://example.com:8443/api/v2/items?page=2&sort=price",
    "https://shop.example.com/p/4111-1111-1111-1112?ref=2024-05-26",
    "redis://127.0.0.1:6379/0",
    "postgresql://db.internal:5432/app",
    "file:///tmp/report-2024-05-26.csv",
    "user@localhost",
    "icon@2x.png",
    "git@github.com:org/repo.git",
    # prose that mentions secrets without holding one
    "Please reset your password at the portal before 2024-06-01.",
    "The API key field is required.",
    "Token usage: 1234 prompt, 56 completion.",
    "token: 512",
    "The password policy requires 12 characters.",
    "Basic plan costs 9.99 per month; Premium 19.99.",
    "Bearer bonds were common in 1920.",
    "max_tokens=256 temperature=0.7",
    "password_reset_url: https://example.com/reset",
    "secret_santa: Bob",
    "credentials: none",
    "password: null",
]

SECRET_VALUES: list[tuple[str, str]] = [
    # free-text assignments and headers
    ("login with password=hunter2 please", "hunter2"),
    ("DB_PASSWORD=s3cr3t-Pa55 ./run.sh", "s3cr3t-Pa55"),
    ("api_key: 9f8e7d6c5b4a", "9f8e7d6c5b4a"),
    ("X-Api-Key: 0123456789abcdef", "0123456789abcdef"),
    ("curl -H 'Authorization: Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b'", "9944b0919"),
    ("Authorization: Bearer abc.def.ghi", "abc.def.ghi"),
    ("authorization=Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA"),
    ("Bearer 4f3c2b1a0f9e8d7c6b5a", "4f3c2b1a0f9e8d7c6b5a"),
    ("Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA"),
    ("GET /v1/items?api_key=abcd1234efgh&page=2", "abcd1234efgh"),
    ("client_secret = 'Zx9-yW8_vU7'", "Zx9-yW8_vU7"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("passphrase: correct horse", "correct"),
    ("token=ghs-opaque-abcdef123456", "ghs-opaque-abcdef123456"),
    # secret-named keys inside JSON text (tool results are strings)
    ('{"user": "bob", "password": "hunter2"}', "hunter2"),
    ('{"config": {"api_key": "abc 123 def"}}', "abc 123 def"),
    ('{"access_token": "ya29.a0AfH6SMBx", "expires_in": 3599}', "ya29.a0AfH6SMBx"),
    ('{"pin": 1, "password": 12345678}', "12345678"),
    ('"{\\"refresh_token\\": \\"1//0gAbCdEf\\"}"', "1//0gAbCdEf"),
    # connection strings
    ("postgres://app:pa55word@db.internal:5432/app", "pa55word"),
    ("postgresql://admin:S3cr3t!@10.0.0.5/prod", "S3cr3t!"),
    ("redis://:topsecret@127.0.0.1:6379/0", "topsecret"),
    ("mongodb+srv://svc:Zq8p0w@cluster0.example.net/db", "Zq8p0w"),
    ("https://deploy:ghp-like-secret@git.example.com/repo.git", "ghp-like-secret"),
    ("host=db user=app password=pa55 dbname=app", "pa55"),
    # provider keys
    ("key sk-proj-abcdefghijklmnopqrstu", "sk-proj-abcdefghijklmnopqrstu"),
    ("OPENAI_API_KEY sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v2W3x4", "A1b2C3d4E5f6"),
    ("sk-ant-api03-" + "x" * 40 + "-abcAA", "sk-ant-api03"),
    ("pk-lf-1234abcd-5678-90ef-abcd-1234567890ab", "1234abcd-5678"),
    ("sk-lf-1234abcd-5678-90ef-abcd-1234567890ab", "1234abcd-5678"),
    ("AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A"),
    ("ghp_" + "a1B2c3D4e5" * 4, "a1B2c3D4e5"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "11ABCDEFG0123"),
    ("glpat-abcdefghij0123456789", "abcdefghij0123456789"),
    ("xoxb-1234567890-0987654321-AbCdEfGhIjKl", "1234567890-0987654321"),
    ("sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("AIzaSyA-1234567890abcdefghijklmnopqrstu", "AIzaSyA-1234567890"),
    ("hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "AbCdEfGhIjKl"),
    (
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "eyJzdWIiOiIxMjM0NTY3ODkwIn0",
    ),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1234\n-----END RSA PRIVATE KEY-----",
        "MIIEpAIBAAKCAQEA1234",
    ),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC", "MIIEvQIBADANBgkq"),
    # PII (default kinds)
    ("mail bob.smith+shop@example.co.uk today", "bob.smith+shop@example.co.uk"),
    ("call +44 20 7946 0958 now", "7946 0958"),
    ("call +1 (555) 123-4567", "123-4567"),
    ("+14155552671", "4155552671"),
    ("US office (555) 123-4567", "123-4567"),
    ("US office 555-123-4567.", "555-123-4567"),
    ('{"phone": "06 12 34 56 78"}', "06 12 34 56 78"),
    ("mobile: 0612345678", "0612345678"),
    ("card 4111 1111 1111 1111 exp 12/27", "4111 1111 1111 1111"),
    ("card 4111-1111-1111-1111", "4111-1111-1111-1111"),
    ("5500000000000004", "5500000000000004"),
    ("amex 3782 822463 10005", "3782 822463 10005"),
]


def _mixed_text(size: int) -> str:
    """About ``size`` characters of tool traffic: mostly safe values, a few secrets."""
    parts: list[str] = []
    secrets = [text for text, _ in SECRET_VALUES]
    i = n = 0
    while n < size:
        value = SAFE_VALUES[i % len(SAFE_VALUES)] if i % 10 else secrets[i % len(secrets)]
        parts.append(value)
        n += len(value) + 1
        i += 1
    return "\n".join(parts)


def masking_benchmark(masker: Masker | None = None, size: int = 1_000_000) -> dict[str, float]:
    """Corpus counts and throughput of ``masker`` (default: :class:`Masker()`).

    Returns:
        ``mask_false_positives`` (safe values changed, must be 0), ``mask_missed_secrets``
        (secrets still present, must be 0) and ``mask_mb_per_s`` (uncached throughput on
        ``size`` characters of mixed tool traffic, best of three).
    """
    m = masker or Masker()
    false_positives = sum(1 for v in SAFE_VALUES if m.text(v) != v)
    missed = sum(1 for text, secret in SECRET_VALUES if secret in m.text(text))
    text = _mixed_text(size)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        m.text(text)  # longer than the cache's limit: masked every time
        best = min(best, time.perf_counter() - start)
    return {
        "mask_false_positives": float(false_positives),
        "mask_missed_secrets": float(missed),
        "mask_mb_per_s": round(len(text.encode()) / 1e6 / best, 2),
    }
