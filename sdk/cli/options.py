"""The command-line options that several commands take, each defined once.

Every alias is a typer ``Annotated`` type; a command takes it as ``name: Alias = default``. The
flag comes from the parameter's name (``trace_db: TraceDbOption`` is ``--trace-db``, ``db`` is
``--db``), except where an alias names its flags. Defaults stay in the signatures (typer
refuses them inside ``Annotated``); the shared ones are the constants below. The layer above
(``evoharness.evolve.cli``) imports these too, so ``--registry`` reads the same everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "HOME",
    "REGISTRY",
    "TRACE_DB",
    "ActorOption",
    "ApiKeyEnvOption",
    "BaseUrlOption",
    "ConcurrencyOption",
    "EnvOption",
    "EvalDbOption",
    "LabelOption",
    "MinDwellOption",
    "PromptsInLangfuseOption",
    "ReasonOption",
    "RegistryOption",
    "StagesOption",
    "TagOption",
    "TaskLimitOption",
    "ToleranceOption",
    "TraceDbOption",
]

HOME = Path(".evoharness")
"""Where the stores live by default (relative to the working directory)."""
REGISTRY = str(HOME / "registry.db")
"""The default artifact registry (``--registry``; ``EVOHARNESS_REGISTRY`` overrides it)."""
TRACE_DB = Path(os.environ.get("EVOHARNESS_TRACE_DB", str(HOME / "traces.db")))
"""The default local trace store (``--db``; ``EVOHARNESS_TRACE_DB`` overrides it)."""

# -- stores ---------------------------------------------------------------------------------
TraceDbOption = Annotated[Path, typer.Option(help="Local trace store (SQLite).")]
EvalDbOption = Annotated[
    Path | None,
    typer.Option(
        help="Trace store of the offline runs (evaluations, searches, gates); default: "
        "<db>.eval.db beside --db. They are tagged evoharness.offline either way, so no "
        "production read (cycle, judge, report, monitor, rollout) counts them."
    ),
]
RegistryOption = Annotated[
    str,
    typer.Option(
        envvar="EVOHARNESS_REGISTRY",
        help="Artifact registry (prompts, guard rules, memory snapshots, adapters): a SQLite "
        "path or postgresql://user@host:5432/db",
    ),
]
PromptsInLangfuseOption = Annotated[
    bool,
    typer.Option(
        "--langfuse",
        help="Prompt versions in Langfuse (LANGFUSE_PUBLIC_KEY/SECRET_KEY/BASE_URL); the "
        "registry keeps rollouts and the audit log.",
    ),
]

# -- which runs -------------------------------------------------------------------------------
EnvOption = Annotated[
    str,
    typer.Option(
        help="Environment: a registered name (evoharness.environments entry points, e.g. "
        "shop) or package.module:Object."
    ),
]
TaskLimitOption = Annotated[int | None, typer.Option(min=1, help="Use only the first N tasks.")]
TagOption = Annotated[list[str] | None, typer.Option(help="Only traces with these tags")]
ConcurrencyOption = Annotated[
    int, typer.Option(min=1, max=256, help="How many tasks (or judgements) run at once.")
]

# -- models ---------------------------------------------------------------------------------
BaseUrlOption = Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")]
ApiKeyEnvOption = Annotated[
    str | None, typer.Option(help="Name of the environment variable holding the API key.")
]

# -- rollouts: every command that starts one (prompts rollout, prompt-evolve) ---------------
StagesOption = Annotated[
    str, typer.Option(help="Traffic per stage, ending at 1.0 (0.1,0.3,1.0 or 10%,30%,100%).")
]
MinDwellOption = Annotated[
    float,
    typer.Option("--min-dwell-s", "--dwell", min=0, help="Minimum seconds in each stage."),
]
ToleranceOption = Annotated[
    list[str] | None,
    typer.Option(
        "--tolerance",
        metavar="METRIC=VALUE",
        help="Allowed worsening, repeatable: tokens=10% lets a winner cost 10% more tokens "
        "(tokens, latency_s: relative to the control; rates: absolute).",
    ),
]

# -- label moves (audited) ------------------------------------------------------------------
LabelOption = Annotated[str, typer.Option(help="The label to move")]
ActorOption = Annotated[str, typer.Option(help="Recorded in the audit log")]
ReasonOption = Annotated[
    str, typer.Option("--reason", "-m", help="Why (recorded in the audit log)")
]
