"""The options of this layer's commands that several of them take, each defined once.

The options every layer shares (``--db``, ``--registry``, ``--tag``, ``--concurrency``,
``--base-url``, ``--api-key-env``, ...) are in :mod:`evoharness.sdk.cli.options`; these are
the ones only judging, curating and the prompt layer take.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "JudgeEnvOption",
    "JudgeKind",
    "JudgeModelOption",
    "MemoryOption",
    "MetaOption",
    "PluginEnvOption",
    "RejudgeOption",
    "SessionOption",
    "StateOption",
    "TemperatureOption",
    "VerboseOption",
    "VotesOption",
]

StateOption = Annotated[Path, typer.Option(help="Evolve state (SQLite).")]
MemoryOption = Annotated[Path, typer.Option(help="Memory store (SQLite).")]
PluginEnvOption = Annotated[
    str,
    typer.Option(
        "--env",
        help="Environment plugin: generic (no checker: evidence only), a registered name "
        "(evoharness.environments entry points, e.g. shop) or package.module:Object.",
    ),
]
SessionOption = Annotated[str | None, typer.Option("--session", help="Only this session")]
MetaOption = Annotated[
    list[str] | None, typer.Option("--meta", help="Only traces whose metadata has KEY=VALUE")
]

# -- the judge ------------------------------------------------------------------------------
JudgeKind = Annotated[
    str,
    typer.Option(
        "--judge",
        help="rule (rules only), llm (rules + a model for what no rule decides; rules win), "
        "relative (rules + a model ranking runs of the same task against each other)",
    ),
]
JudgeEnvOption = Annotated[
    str | None,
    typer.Option(
        "--judge-env",
        help="Read the scores of this environment's judge (its plugin name, e.g. shop); "
        "default: the judge of the environment each trace is tagged with, else the newest "
        "judge other than generic, else the generic judge.",
    ),
]
JudgeModelOption = Annotated[str | None, typer.Option("--judge-model", help="Judge model name")]
VotesOption = Annotated[int, typer.Option("--votes", min=1, max=15, help="Replies per judgement")]
TemperatureOption = Annotated[
    float, typer.Option("--temperature", min=0.0, max=2.0, help="Judge sampling temperature")
]
RejudgeOption = Annotated[
    bool, typer.Option("--rejudge", help="Judge again even what is judged and unchanged")
]
VerboseOption = Annotated[
    bool,
    typer.Option(
        "--verbose", help="Print every judge failure (else three) and any error's traceback"
    ),
]
