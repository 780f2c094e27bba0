"""No package imports another package's private (``_x``) modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sdk", "harness", "evolve", "examples")


def test_no_package_imports_another_packages_private_modules() -> None:
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else []
                )
                for name in names:
                    parts = name.split(".")
                    if parts[0] != "evoharness" or len(parts) < 3 or parts[1] == package:
                        continue
                    if any(p.startswith("_") for p in parts[2:]):
                        found.append(f"{path.relative_to(ROOT)}: {name}")
    assert not found, found
