"""The command-line options that several commands take, each defined once.

Every alias is a typer ``Annotated`` type; a command takes it as ``name: Alias = default``. The
flag comes from the parameter's name (``trace_db: TraceDbOption`` is ``--trace-db``, ``db`` is
``--db``), except where an alias names its flags. Defaults stay in the signatures (typer
refuses them inside ``Annotated``); the shared ones are the constants below. The layer above
(``evoharness.evolve.cli``) imports these too, so ``--registry`` reads the same everywhere.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from evoharness.harness.errors import ConfigError
from evoharness.sdk.cli.error_line import DEBUG_ENV

__all__ = [
    "HOME",
    "REGISTRY",
    "STAGED",
    "TRACE_DB",
    "ActorOption",
    "ApiKeyEnvOption",
    "ApplyOption",
    "BaseUrlOption",
    "ConcurrencyOption",
    "EnvOption",
    "EvalDbOption",
    "LabelOption",
    "MinDwellOption",
    "OutcomesDbOption",
    "PromptsInLangfuseOption",
    "ReasonOption",
    "RegistryOption",
    "StagesOption",
    "Staging",
    "TagOption",
    "TaskLimitOption",
    "ToleranceOption",
    "TraceDbOption",
    "TracebackOption",
    "check_number",
    "finite_numbers",
    "grouped",
    "non_empty",
    "rollout_options",
]

R = TypeVar("R")

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


@dataclass(frozen=True)
class Staging:
    """A rollout's settings as ``--stages``, ``--min-dwell-s`` and ``--tolerance`` gave
    them, parsed and checked (:func:`rollout_options`)."""

    stages: tuple[float, ...] = (0.1, 0.3, 1.0)
    min_dwell_s: float = 3600.0
    tolerances: dict[str, float] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        """As keyword arguments: ``RolloutController.start``, ``Promotion``,
        ``PromptLayerConfig`` take them by these names."""
        return {
            "stages": self.stages,
            "min_dwell_s": self.min_dwell_s,
            "tolerances": dict(self.tolerances),
        }


STAGED = Staging()
"""The default of a command's ``staging`` parameter (typer never reads it: the options of
:func:`rollout_options` stand in its place)."""


def rollout_options(
    stages: StagesOption = "0.1,0.3,1.0",
    min_dwell_s: MinDwellOption = 3600.0,
    tolerance: ToleranceOption = None,
) -> Staging:
    """The options of every command that starts a rollout, one group (``grouped("staging",
    rollout_options)``): checked here, before the command does any work."""
    from evoharness.sdk.rollout import parse_stages, parse_tolerances

    return Staging(tuple(parse_stages(stages)), min_dwell_s, parse_tolerances(tolerance or []))


OutcomesDbOption = Annotated[
    Path | None, typer.Option("--db", help="Trace store to read the arms' outcomes from.")
]
ApplyOption = Annotated[bool, typer.Option(help="Apply the decision (default: dry run).")]

# -- label moves (audited) ------------------------------------------------------------------
LabelOption = Annotated[str, typer.Option(help="The label to move")]
ActorOption = Annotated[str, typer.Option(help="Recorded in the audit log")]
ReasonOption = Annotated[
    str, typer.Option("--reason", "-m", help="Why (recorded in the audit log)")
]


# -- options that go together ----------------------------------------------------------------
def grouped(name: str, build: Callable[..., Any]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """A decorator: the command's parameter ``name`` stands for a group of options, those of
    ``build`` (its parameters, typer-annotated, with their defaults), and is passed what
    ``build`` makes of them.

    Typer sees the group's options in the place of ``name``, so a group of options that go
    together (the judge's, a rollout's) is written once, in ``build``, and every command
    that takes it reads ``judging: JudgeSpec = JudgeSpec()``; ``build`` checks them (a
    :class:`ConfigError`) before the command runs. Example::

        def judge_options(judge_kind: JudgeKind = "rule", votes: VotesOption = 3) -> Spec:
            return Spec(judge_kind, votes=votes)

        @app.command()
        @grouped("judging", judge_options)
        def judge(db: TraceDbOption = TRACE_DB, judging: Spec = Spec()) -> None: ...
    """
    group = list(inspect.signature(build, eval_str=True).parameters.values())

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        signature = inspect.signature(command, eval_str=True)  # typer reads evaluated types
        own = list(signature.parameters.values())
        names = [p.name for p in own]
        if name not in names:
            raise TypeError(f"{command.__name__} takes no {name!r} to stand for the options")
        at = names.index(name)
        merged = signature.replace(
            parameters=[*own[:at], *group, *own[at + 1 :]]
        )  # a name taken twice is a ValueError here, when the command is defined

        @functools.wraps(command)
        def call(*args: Any, **kwargs: Any) -> R:
            given = merged.bind(*args, **kwargs)
            given.apply_defaults()
            values = dict(given.arguments)
            made = build(**{p.name: values.pop(p.name) for p in group})
            return command(**values, **{name: made})

        call.__signature__ = merged  # type: ignore[attr-defined]  # what typer reads
        call.__annotations__ = {
            **{p.name: p.annotation for p in merged.parameters.values()},
            "return": merged.return_annotation,
        }
        return call

    return decorate


# -- values every option of a kind must refuse ------------------------------------------------
def non_empty(value: str | None) -> str | None:
    """A typer callback: an empty (or blank) name is refused where the option is parsed."""
    if value is not None and not value.strip():
        raise typer.BadParameter("must not be empty")
    return value


def check_number(what: str, value: float, info: Any) -> float:
    """``value`` if it is finite and within the bounds of the typer option ``info`` (its
    ``min``/``max``); else a :class:`ConfigError` naming ``what``. For values that reach an
    option's setting another way than its flag (``weights run --set lr=...``)."""
    low, high = getattr(info, "min", None), getattr(info, "max", None)
    below = low is not None and value < low
    above = high is not None and value > high
    if math.isfinite(value) and not below and not above:
        return value
    bounds = [f"at least {low:g}" if low is not None else ""]
    bounds.append(f"at most {high:g}" if high is not None else "")
    within = " and ".join(b for b in bounds if b)
    raise ConfigError(f"{what} must be a finite number {within}".rstrip(), field="set")


def finite_numbers(command: Any) -> Any:
    """``command`` (a click command built from a typer app) with every float option and
    argument, in it and in every subcommand, refusing ``nan`` and ``inf`` by name.

    Typer checks ``min``/``max`` with pydantic, which lets ``inf`` through every bound that
    has no maximum (``--lr inf``, ``--min-dwell-s inf``) and answers ``nan`` with "should be
    greater than or equal to ...": a non-finite number is never a setting, so it is refused
    here, before the bounds, once for the whole CLI."""
    for param in getattr(command, "params", ()):
        if _takes_floats(param):
            param.process_value = _finite(param, param.process_value)
    for sub in getattr(command, "commands", {}).values():
        finite_numbers(sub)
    return command


def _takes_floats(param: Any) -> bool:
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if typing.get_origin(annotation) in (list, tuple):
        return float in typing.get_args(annotation)
    return annotation is float


def _as_float(value: Any) -> float | None:
    if isinstance(value, float):
        return value
    try:
        return float(value) if isinstance(value, str) else None
    except ValueError:
        return None  # not a number at all: typer says so


def _finite(param: Any, process: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def process_value(ctx: Any, value: Any) -> Any:
        for given in value if isinstance(value, list | tuple) else (value,):
            number = _as_float(given)
            if number is not None and not math.isfinite(number):
                raise typer.BadParameter(
                    f"must be a finite number, not {given}", ctx=ctx, param=param
                )
        return process(ctx, value)

    return process_value


TracebackOption = Annotated[
    bool,
    typer.Option("--verbose", help=f"Print the traceback behind an error line (or {DEBUG_ENV}=1)."),
]
"""``--verbose`` on an SDK command: the CLI boundary prints the traceback behind the error
line (the boundary reads the flag from the command line; the root's ``evoharness
--verbose`` means the same)."""
