"""The README's five-line example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_five_line_example_runs_as_written(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    first = blocks[0]
    assert len(first.strip().splitlines()) == 5
    done = subprocess.run(
        [sys.executable, "-c", first], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Hi!"


def test_the_application_example_runs_with_a_scripted_model(tmp_path: Path) -> None:
    """The second block, with the OpenAI model swapped for a scripted one (no network)."""
    second = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)[1]
    assert '"openai:gpt-4o-mini"' in second
    code = second.replace(
        '"openai:gpt-4o-mini"', 'ScriptedChatModel(policy=lambda m: "It has shipped.")'
    )
    code = "from evoharness.sdk.testing import ScriptedChatModel\n" + code
    code += "\nprint(agent.invoke('and order 43?', user_id='u1', thread_id='t-1')"
    code += "['messages'][-1].content)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("It has shipped.")
    assert (tmp_path / ".evoharness" / "traces.db").exists()
