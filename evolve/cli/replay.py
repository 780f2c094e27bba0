"""``evoharness evolve replay``: the P1 bad cases run again with a replay model, gated into SFT.

Registered on the ``evolve`` group by :mod:`evoharness.evolve.cli.evolve`; the work is
:func:`evoharness.evolve.routing.replay.replay_bad_cases`.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import ExitStack, closing
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from evoharness.evolve.cli.options import (
    RULES,
    JudgeSpec,
    PluginEnvOption,
    StateOption,
    judge_options,
    judge_registry,
)
from evoharness.harness.errors import ConfigError
from evoharness.sdk import cli as sdk_cli
from evoharness.sdk.cli.options import HOME, REGISTRY, ConcurrencyOption, RegistryOption, grouped
from evoharness.sdk.cli.stores import opened

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

__all__ = ["replay"]

console = sdk_cli.console


def replay_model(
    model: str | None, factory: str | None, base_url: str | None, api_key_env: str | None
) -> BaseChatModel:
    """The replay model: ``--model-factory package.module:callable`` (any LangChain chat
    model), else ``--model`` on an OpenAI-compatible endpoint (``--base-url``)."""
    if factory:
        from langchain_core.language_models import BaseChatModel

        from evoharness.sdk.environment import resolve_plugin

        made = resolve_plugin(factory)
        made = made() if callable(made) and not isinstance(made, BaseChatModel) else made
        if not isinstance(made, BaseChatModel):
            raise ConfigError(
                f"--model-factory {factory!r} gave a {type(made).__name__}, not a LangChain "
                "chat model; point it at a model object or a zero-argument function "
                "returning one",
                field="model_factory",
            )
        return made
    if not model:
        raise ConfigError(
            "evolve replay needs a replay model: --model NAME (with --base-url for an "
            "OpenAI-compatible endpoint such as vLLM) or --model-factory package.module:fn "
            "(any LangChain chat model)",
            field="model",
        )
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    key = os.environ.get(api_key_env) if api_key_env else None
    if api_key_env and key is None:
        raise ConfigError(
            f"environment variable {api_key_env} is not set; export the replay model's API key",
            field="api_key_env",
        )
    key = key or os.environ.get("OPENAI_API_KEY") or "unused"  # local servers ignore it
    return ChatOpenAI(model=model, base_url=base_url, api_key=SecretStr(key), max_retries=1)


@grouped("judging", judge_options)
def replay(
    env: PluginEnvOption = "generic",
    state: StateOption = HOME / "evolve.db",
    replay_db: Annotated[
        Path,
        typer.Option(
            "--replay-db", help="Trace store for the replays (their own: never the app's --db)"
        ),
    ] = HOME / "replay-traces.db",
    registry: RegistryOption = REGISTRY,
    model: Annotated[
        str | None, typer.Option("--model", help="Replay model on an OpenAI-compatible endpoint")
    ] = None,
    model_factory: Annotated[
        str | None,
        typer.Option(
            "--model-factory", help="package.module:fn returning any LangChain chat model"
        ),
    ] = None,
    judging: JudgeSpec = RULES,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many cases")] = None,
    min_total: Annotated[float, typer.Option(min=0.0, max=1.0, help="SFT gate: total")] = 0.75,
    min_gain: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="SFT gate: total above the original's")
    ] = 0.15,
    max_tokens: Annotated[int, typer.Option(min=1, help="SFT gate: conversation tokens")] = 16_000,
    concurrency: ConcurrencyOption = 4,
) -> None:
    """Run the P1 bad cases (the replay pool) again with a replay model; a replay that
    scores >= 0.75, beats the original by >= 15 points, is 100% well-formed and <= 16K
    tokens enters the SFT pool. Resumable: a case already replayed by the model is read
    back, not run again."""
    from evoharness.evolve.environment import build_rubrics, load_plugin, runtime_of
    from evoharness.evolve.judging.state import EvolveState
    from evoharness.evolve.routing.replay import ReplayGate, replay_bad_cases
    from evoharness.harness.tracing import TraceStore

    gate = ReplayGate(min_total=min_total, min_gain=min_gain, max_tokens=max_tokens)
    chat = replay_model(model, model_factory, judging.base_url, judging.api_key_env)
    spec = replace(judging, registry=judge_registry(str(registry)))
    plugin = load_plugin(env)
    world = runtime_of(plugin)  # a replay runs the case again: it needs the run side
    with ExitStack() as stack:
        st = stack.enter_context(closing(opened("--state", state, EvolveState)))
        store = stack.enter_context(closing(opened("--replay-db", replay_db, TraceStore)))
        with console.status(f"replaying the P1 bad cases of {plugin.name}"):
            report = asyncio.run(
                replay_bad_cases(
                    st,
                    env=world,
                    model=chat,
                    grader=spec.grader(plugin),
                    rubrics=build_rubrics(plugin),
                    store=store,
                    gate=gate,
                    limit=limit,
                    concurrency=concurrency,
                )
            )
    table = Table(title=escape(f"evolve replay ({plugin.name}, {report.model})"))
    for column in ("case", "total", "gain", "tokens", "format", "sft", "why"):
        table.add_column(column)
    for o in report.outcomes:
        table.add_row(
            o.trace_id[:12],
            "-" if o.total is None else f"{o.original_total:.2f} -> {o.total:.2f}",
            "-" if o.gain is None else f"{o.gain * 100:+.0f}",
            str(o.tokens),
            "valid" if o.format_valid else "invalid",
            "yes" if o.accepted else "no",
            escape(o.reason),
        )
    console.print(table)
    console.print(
        f"cases={report.cases} replayed={report.replayed} resumed={report.resumed} "
        f"accepted={report.accepted} (replays in {replay_db})",
        markup=False,
    )
