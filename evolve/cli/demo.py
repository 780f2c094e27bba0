"""``evoharness demo``: the whole loop on the shop environment (SIMULATED offline policy).

baseline -> memory (one evolve cycle) -> prompt proposal, paired evaluation and a staged
rollout -> optionally (``--weights``, minutes) LoRA SFT and DPO on a real small model ->
a per-layer table for val and test and a self-contained HTML report.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from evoharness.sdk.cli import console
from evoharness.sdk.cli.options import TaskLimitOption

if TYPE_CHECKING:  # imported where they run: --help and argument errors need none of them
    from evoharness.evolve.demo.cycle import DemoResult, Phase
    from evoharness.evolve.demo.prompts import PromptDemoResult

WORKDIR = Path(".evoharness/demo")


def _say(msg: str) -> None:
    console.print(f"[dim]{escape(msg)}[/dim]")


def _base_table(result: DemoResult) -> Table:
    table = Table(title="shop · val · offline policy (SIMULATED)")
    table.add_column("metric")
    for p in result.phases:
        table.add_column(escape(p.label), justify="right")
    rows: list[tuple[str, Callable[[Phase], str]]] = [
        ("success rate", lambda p: f"{p.report.success_rate:.1%}"),
        ("mean score", lambda p: f"{p.report.mean_score:.3f}"),
        ("P0 rate (rule judge)", lambda p: f"{p.p0_rate:.1%}"),
        ("tokens / task", lambda p: f"{p.report.mean_tokens:,.0f}"),
        ("model calls / task", lambda p: f"{p.report.mean_model_calls:.1f}"),
        ("crashed runs", lambda p: str(p.report.errors)),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(p) for p in result.phases))
    kinds = sorted({k for p in result.phases for k in p.report.failure_counts})
    for k in kinds:
        table.add_row(
            escape(f"failure: {k}"),
            *(str(p.report.failure_counts.get(k, 0)) for p in result.phases),
        )
    return table


def _print_learned(result: DemoResult) -> None:
    c = result.cycle
    console.print(
        f"evolve cycle on the train traces: {c.episodes} episodes judged "
        f"({c.decided} decided, {c.undecided} undecided, {c.judge.failed} judge failures); "
        f"routed {c.routed}; memory v{c.memory_version}: {c.strategies} strategies, "
        f"{c.lessons} lessons; guard rules v{c.guard_version}"
    )
    from evoharness.sdk.memory.entries import scope_label

    console.print("learned (top entries, as injected into the prompt):")
    strategies = [e for e in result.learned if e.kind == "strategy"][:3]
    lessons = [e for e in result.learned if e.kind == "lesson"][:7]
    for e in [*strategies, *lessons]:
        hint = "; ".join(e.avoid_hints) or e.summary
        console.print(
            f"  {escape(f'[{e.kind}]')} ({escape(scope_label(e))}) {escape(hint)}  "
            f"[dim]conf {e.confidence:.2f}, {len(e.references)} traces[/dim]"
        )


def _layer_rows(prompt: PromptDemoResult) -> list[dict[str, Any]]:
    """The per-layer rows (val and test) in the report's layer-results format."""
    base = prompt.base
    p0 = {p.label: p.p0_rate for p in base.phases} if base is not None else {}
    tokens = {p.label: p.report.mean_tokens for p in base.phases} if base is not None else {}
    names = {"harnessed": "baseline", "harnessed + memory": "+memory"}
    source = {"baseline": "harnessed", "+memory": "harnessed + learned"}
    rows: list[dict[str, Any]] = []
    for step in prompt.steps:
        layer = names.get(step.step)
        if layer is None and step.step.startswith("memory + prompt"):
            layer = "+prompt"
        elif layer is None and step.step.startswith("prompt only"):
            layer = "+prompt (without memory)"
        if layer is None:
            continue
        if step.val is None and step.test is None:  # nothing was evaluated: say why
            rows.append(
                {
                    "layer": layer,
                    "split": "val",
                    "success_rate": None,
                    "simulated": True,
                    "note": step.note or step.step,
                }
            )
            continue
        for split, value in (("val", step.val), ("test", step.test)):
            if value is None:
                continue
            row: dict[str, Any] = {
                "layer": layer,
                "split": split,
                "success_rate": value,
                "simulated": True,
                "note": f"{step.step}; {step.note}" if step.note else step.step,
            }
            if split == "val" and layer in source:
                row["p0_rate"] = p0.get(source[layer])
                row["tokens_per_task"] = tokens.get(source[layer])
            rows.append(row)
    return rows


def _layer_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="success rate per layer (shop; SIMULATED policy unless marked real)")
    table.add_column("layer")
    table.add_column("val", justify="right")
    table.add_column("test", justify="right")
    table.add_column("P0 (val)", justify="right")
    table.add_column("how")
    layers: dict[str, dict[str, Any]] = {}
    for r in rows:
        layers.setdefault(r["layer"], {})[r["split"]] = r
    for layer, by_split in layers.items():
        val, test = by_split.get("val", {}), by_split.get("test", {})

        def pct(x: Any) -> str:
            return f"{x:.1%}" if isinstance(x, int | float) else "-"

        kind = "simulated" if (val or test).get("simulated", True) else "real model"
        table.add_row(
            escape(layer),
            pct(val.get("success_rate")),
            pct(test.get("success_rate")),
            pct(val.get("p0_rate")),
            escape(f"{kind}: {(val or test).get('note', '')}"),
        )
    return table


def _weights_rows(workdir: Path, val_tasks: int) -> list[dict[str, Any]]:
    """+SFT and +RL on SmolLM2 (a REAL model) through the harness; minutes on a CPU."""
    from evoharness.evolve.benchmarks import weights

    out = weights.run(val_tasks=val_tasks, workdir=workdir / "weights", echo=_say)
    note = f"SmolLM2-135M, {val_tasks} val tasks, real model"
    valid = {
        "baseline (real model)": out.get("tool_call_valid_base"),
        "+SFT": out.get("tool_call_valid_sft"),
    }
    rows = [
        {"layer": "baseline (real model)", "split": "val", "success_rate": out["base_success"]},
        {"layer": "+SFT", "split": "val", "success_rate": out["sft_success"]},
        {"layer": "+RL", "split": "val", "success_rate": out["rl_success"]},
    ]
    for r in rows:
        share = valid.get(str(r["layer"]))
        extra = f"; valid tool calls {share:.0%}" if isinstance(share, float) else ""
        r.update(simulated=False, note=note + extra)
    return rows


def demo(
    train_limit: TaskLimitOption = None,
    val_limit: TaskLimitOption = None,
    test_limit: TaskLimitOption = None,
    weights: Annotated[
        bool,
        typer.Option(help="Also train LoRA adapters (SFT, DPO) on SmolLM2; minutes on a CPU."),
    ] = False,
    weights_val_tasks: Annotated[int, typer.Option(min=1)] = 4,
    workdir: Annotated[
        Path, typer.Option(file_okay=False, help="Where the demo keeps its stores.")
    ] = WORKDIR,
) -> None:
    """The whole loop on the shop (SIMULATED policy): memory, prompt, rollout, report."""
    from evoharness.evolve.demo.prompts import run_prompt_demo
    from evoharness.evolve.report import write_report
    from evoharness.harness.tracing import TraceStore
    from evoharness.sdk.registry import open_registry

    _say("loading the shop environment and the evolve layers")
    result = run_prompt_demo(
        workdir,
        train_limit=train_limit,
        val_limit=val_limit,
        test_limit=test_limit,
        on_phase=_say,
    )
    assert result.base is not None
    console.print(_base_table(result.base))
    _print_learned(result.base)
    console.print("prompt layer (proposal -> gates -> paired evaluation -> rollout):")
    for line in result.lines():
        console.print(line, markup=False)
    rows = _layer_rows(result)
    if weights:
        rows += _weights_rows(workdir, weights_val_tasks)
    console.print(_layer_table(rows))
    layers_file = workdir / "layers.json"
    layers_file.write_text(
        json.dumps(
            {"title": "shop", "simulated": not weights, "note": "offline policy", "rows": rows},
            indent=2,
        )
    )
    store = TraceStore(workdir / "traces.db")
    registry = open_registry(workdir / "registry.db")
    try:
        report = write_report(
            workdir / "report.html",
            store=store,
            registry=registry,
            layer_results=json.loads(layers_file.read_text()),
            on_progress=_say,
        )
    finally:
        store.close()
        registry.close()
    console.print(
        "The offline policy is a simulator whose mistakes drop when a lesson or a prompt rule "
        "names the step it skips. This demonstrates the mechanics of the loop, not gains on "
        "real models" + (" (the +SFT/+RL rows are a real model)." if weights else ".")
    )
    console.print(f"traces: {workdir / 'traces.db'} (evoharness traces list)")
    console.print(f"report: {report.resolve()}")
