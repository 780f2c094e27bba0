"""The CLI starts without the machinery its commands use: ``--help`` and argument errors
import typer and rich and the command modules, never LangChain, pydantic models, torch or
the evolve layers (each command imports those when it runs). CPU time is measured by
``evoharness bench cli`` (``cli_start_s``), not asserted here: this machine is shared."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "langchain",
    "langchain_core",
    "langgraph",
    "langsmith.run_trees",
    "torch",
    "transformers",
    "httpx",
    "numpy",
)
# the harness's lazily exporting sub-packages: their __init__ holds name lists, no imports
LAZY_PACKAGES = tuple(
    f"evoharness.harness.{name}" for name in ("breaker", "control", "governance", "hooks")
)
OURS_ALLOWED = ("evoharness.harness.errors", "evoharness.harness.lazy_exports", *LAZY_PACKAGES)


def _imported(argv: list[str]) -> tuple[int, list[str]]:
    code = (
        "import contextlib, io, json, sys\n"
        "from evoharness.evolve.cli import main\n"
        "out, err = io.StringIO(), io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        f"    rc = main({argv!r})\n"
        "print(json.dumps([rc, sorted(sys.modules)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    rc, modules = json.loads(done.stdout.strip().splitlines()[-1])
    return rc, modules


def _heavy(modules: list[str]) -> list[str]:
    found = [m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY]
    ours = [
        m
        for m in modules
        if m.startswith("evoharness.")
        and ".cli" not in m
        and m not in OURS_ALLOWED
        and m not in ("evoharness.sdk", "evoharness.harness", "evoharness.evolve")
        and m != "evoharness.sdk.runtime"
    ]
    return found + ours


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["evolve", "--help"],
        ["evolve", "cycle", "--help"],
        ["run", "--help"],
        ["prompts", "--help"],
        ["registry", "promote", "--help"],
        ["bench", "--help"],
        ["monitor", "--help"],
    ],
    ids=" ".join,
)
def test_help_imports_no_machinery(argv: list[str]) -> None:
    rc, modules = _imported(argv)
    assert rc == 0
    assert _heavy(modules) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--concurrency", "0"],
        ["evolve", "judge", "--votes", "abc"],
        ["prompts", "show"],
        ["no-such-command"],
    ],
    ids=" ".join,
)
def test_an_argument_error_imports_no_machinery(argv: list[str]) -> None:
    rc, modules = _imported(argv)
    assert rc == 2
    assert _heavy(modules) == []
