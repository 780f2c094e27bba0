"""The options of this layer's commands that several of them take, each defined once.

The options every layer shares (``--db``, ``--registry``, ``--tag``, ``--concurrency``,
``--base-url``, ``--api-key-env``, ...) are in :mod:`evoharness.sdk.cli.options`; these are
the ones only judging, curating and the prompt layer take. The judge's options are one group
(:func:`judge_options`, making a :class:`JudgeSpec`): a command takes them all as
``judging: JudgeSpec = RULES`` under ``@grouped("judging", judge_options)``.
"""

from __future__ import annotations

import os
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from evoharness.harness.errors import ConfigError
from evoharness.sdk.cli.options import ApiKeyEnvOption, BaseUrlOption, TagOption
from evoharness.sdk.cli.stores import sqlite_file

if TYPE_CHECKING:  # imported where they run: --help and argument errors need none of them
    from langchain_core.language_models import BaseChatModel

    from evoharness.evolve.environment import EvolveEnvironment
    from evoharness.evolve.episodes.traces import EpisodeFilter
    from evoharness.evolve.judging.judge import Judge, RelativeJudge

__all__ = [
    "ALL_TRACES",
    "RULES",
    "JudgeEnvOption",
    "JudgeKind",
    "JudgeModelOption",
    "JudgeSpec",
    "MemoryOption",
    "MetaOption",
    "PluginEnvOption",
    "RejudgeOption",
    "SessionOption",
    "StateOption",
    "TemperatureOption",
    "Traces",
    "VerboseOption",
    "VotesOption",
    "judge_options",
    "judge_registry",
    "trace_options",
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


@dataclass(frozen=True)
class Traces:
    """Which traces a command reads, as ``--tag``, ``--session`` and ``--meta`` gave them
    (:func:`trace_options`)."""

    tags: tuple[str, ...] = ()
    session: str | None = None
    metadata: tuple[tuple[str, str], ...] = ()

    def where(self) -> EpisodeFilter:
        """The episode filter that reads them."""
        from evoharness.evolve.episodes.traces import EpisodeFilter

        options: dict[str, Any] = {"tags": list(self.tags)}
        if self.session is not None:
            options["session_id"] = self.session
        if self.metadata:
            options["metadata"] = dict(self.metadata)
        return EpisodeFilter(**options)


ALL_TRACES = Traces()
"""Every trace: the default of a command's ``traces`` parameter (typer never reads it: the
options of :func:`trace_options` stand in its place)."""


def trace_options(
    tag: TagOption = None, session: SessionOption = None, meta: MetaOption = None
) -> Traces:
    """The options that select traces, one group (``grouped("traces", trace_options)``)."""
    pairs = []
    for m in meta or []:
        key, sep, value = m.partition("=")
        if not sep or not key:
            raise ConfigError(f"bad --meta {m!r}; use KEY=VALUE", field="meta")
        pairs.append((key, value))
    return Traces(tuple(tag or ()), session, tuple(pairs))


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


@dataclass(frozen=True)
class JudgeSpec:
    """What ``--judge`` and its options asked for (picklable: pool workers rebuild it)."""

    kind: str = "rule"
    _: KW_ONLY
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    votes: int = 3
    temperature: float = 0.0
    registry: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("rule", "llm", "relative"):
            raise ConfigError(f"unknown --judge {self.kind!r}; choose rule, llm or relative")
        if self.kind != "rule" and not self.model:
            raise ConfigError(
                f"--judge {self.kind} needs --judge-model (and --base-url for a local "
                "OpenAI-compatible server)",
                field="judge_model",
            )

    def prompt(self, name: str) -> tuple[str | None, str | None]:
        """The active ``judge_prompt/<name>`` text and version from the registry (the
        built-in text is published as version 1 the first time)."""
        from evoharness.evolve.judging.prompts import JUDGE_PROMPT_KIND, JudgePrompts
        from evoharness.sdk.registry import open_registry

        if self.registry is None:
            return None, None
        with open_registry(self.registry) as registry:
            prompts = JudgePrompts(registry)
            prompts.ensure_defaults()
            return prompts.get(JUDGE_PROMPT_KIND, name)

    def chat_model(self) -> BaseChatModel:
        """The judge model (ChatOpenAI against ``base_url``)."""
        from langchain_openai import ChatOpenAI
        from pydantic import SecretStr

        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if self.api_key_env and key is None:
            raise ConfigError(
                f"environment variable {self.api_key_env} is not set; export the judge's API "
                "key there",
                field="api_key_env",
            )
        if key is None:
            key = os.environ.get("OPENAI_API_KEY") or "unused"  # local servers ignore it
        return ChatOpenAI(
            model=str(self.model),
            base_url=self.base_url,
            api_key=SecretStr(key),
            temperature=self.temperature,
            max_retries=1,
        )

    def grader(self, env: EvolveEnvironment) -> Judge:
        """The absolute grader (rules, plus the model with ``--judge llm``)."""
        from evoharness.evolve.environment import build_judge
        from evoharness.evolve.judging.judge import LLMJudge

        if self.kind != "llm":
            return build_judge(env)
        text, version = self.prompt("absolute")
        llm = LLMJudge(self.chat_model(), votes=self.votes, prompt=text, prompt_version=version)
        return build_judge(env, llm=llm)

    def ranker(self) -> RelativeJudge | None:
        """The relative judge with ``--judge relative``."""
        from evoharness.evolve.judging.judge import RelativeJudge

        if self.kind != "relative":
            return None
        text, version = self.prompt("relative")
        return RelativeJudge(
            self.chat_model(), votes=self.votes, prompt=text, prompt_version=version
        )


RULES = JudgeSpec()
"""The rules-only judge: the default of a command's ``judging`` parameter (typer never
reads it: the group's options stand in its place)."""


def judge_options(
    judge_kind: JudgeKind = "rule",
    judge_model: JudgeModelOption = None,
    base_url: BaseUrlOption = None,
    api_key_env: ApiKeyEnvOption = None,
    votes: VotesOption = 3,
    temperature: TemperatureOption = 0.0,
) -> JudgeSpec:
    """The judge's options, one group: ``--judge``, ``--judge-model``, ``--base-url``,
    ``--api-key-env``, ``--votes``, ``--temperature`` (checked here, before the command runs).
    ``--base-url`` and ``--api-key-env`` serve every model of the command (``evolve replay``'s
    replay model too)."""
    return JudgeSpec(
        judge_kind,
        model=judge_model,
        base_url=base_url,
        api_key_env=api_key_env,
        votes=votes,
        temperature=temperature,
    )


def judge_registry(registry: str) -> str:
    """``--registry`` of a judging command, checked up front: it is read only with ``--judge
    llm|relative`` (the judge prompts), but a folder or a file that is no database is
    refused whatever the judge."""
    if "://" not in registry:
        sqlite_file("--registry", Path(registry))
    return registry
