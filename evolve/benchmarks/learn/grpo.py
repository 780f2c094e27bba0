"""The chain's GRPO layer: TRL's GRPO on the train tasks with the environment's own checker as
the reward, from the last kept model.

Only for an environment whose task is one model turn (:attr:`EnvSpec.single_turn`: BFCL's
single-turn categories): its checker grades a single completion the way the evaluation
grades a run, so the reward is the grade the layer is later measured by. A multi-turn task
(the shop) is graded on the whole run with its tool results, which one completion does not
have; there the layer does not run and says so.

Prompts are the train tasks as the kept layers present them: the opening messages (system
prompt with the kept prompt rules and memory, the request) and tool schemas of the last
rejection-sampling round's runs, rendered with the model's chat template (TRL then samples
``grpo_generations`` completions of each). Only the tasks that round both solved and failed
are kept when there are any: a group whose completions all get one reward gives no gradient.

The reward reads a completion as serving does
(:func:`~evoharness.sdk.serving.local.parse_tool_calls`, then the harness's reply check
unwrapping JSON calls written as text) and scores BFCL's verdict: 1 solved, 0 not.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage

from evoharness.evolve.benchmarks.learn.chain import Chain
from evoharness.evolve.benchmarks.learn.weights import round_samples
from evoharness.evolve.weights import (
    GRPORunConfig,
    Sample,
    TrainingError,
    tool_schemas,
    train,
)
from evoharness.harness.control.reply_check import unwrapped_calls
from evoharness.sdk.environment import TaskSpec
from evoharness.sdk.serving.local import parse_tool_calls

Reward = Callable[..., list[float | None]]
"""A TRL reward function: ``(prompts, completions, task_id, **columns) -> scores``."""


def completion_reply(text: str, tools: Sequence[dict[str, Any]], *, unwrap: bool) -> AIMessage:
    """A completion as the agent's reply: its ``<tool_call>`` blocks as calls, else (with
    ``unwrap``, as the harness's reply check does) JSON calls of offered tools written as
    text."""
    content, calls, invalid = parse_tool_calls(text)
    if unwrap and not calls and not invalid:
        names = {t["function"]["name"] for t in tools if "function" in t}
        found = unwrapped_calls(content, names)
        if found:
            content, calls = "", found
    return AIMessage(content=content, tool_calls=calls, invalid_tool_calls=invalid)


def checker_reward(
    world: Any,
    tasks: Mapping[str, TaskSpec],
    *,
    unwrap: bool = True,
) -> Reward:
    """The environment's checker as a GRPO reward: 1.0 for a completion that solves its task
    (``task_id`` column), 0.0 otherwise.

    Args:
        world: The environment (``check`` and ``tools_for``).
        tasks: Task id -> task, for every prompt's ``task_id``.
        unwrap: Read JSON calls written as text like the harness's reply check.
    """

    def checker(
        prompts: Sequence[Any], completions: Sequence[Any], task_id: Sequence[str], **_: Any
    ) -> list[float | None]:
        scores: list[float | None] = []
        for completion, tid in zip(completions, task_id, strict=True):
            task = tasks[tid]
            text = completion if isinstance(completion, str) else str(completion[-1]["content"])
            tools = tool_schemas(world.tools_for(task))
            reply = completion_reply(text, tools, unwrap=unwrap)
            outcome = world.check(task, [HumanMessage(task.request), reply], None)
            scores.append(1.0 if outcome.success else 0.0)
        return scores

    return checker


def step_means(run_dir: Path, keys: Sequence[str]) -> dict[str, float]:
    """The mean of each logged metric in ``keys`` over a run's steps (a step logged twice,
    before and after a resume, counts once: its last line); 0.0 when never logged."""
    by_step: dict[int, dict[str, float]] = {}
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        if any(k in row for k in keys):
            by_step[int(row["step"])] = {k: float(row[k]) for k in keys if k in row}
    return {
        k: sum(v) / len(v) if (v := [r[k] for r in by_step.values() if k in r]) else 0.0
        for k in keys
    }


def mixed_tasks(samples: Sequence[Sample]) -> set[str]:
    """Tasks with both a verified and a failed sample: the prompts whose GRPO groups are
    likely to hold both rewards (DAPO's reason for dynamic sampling)."""
    good = {s.task for s in samples if s.verified}
    return good & {s.task for s in samples if not s.verified}


def _opening(sample: Sample) -> list[dict[str, Any]]:
    """The messages before the run's first assistant turn."""
    head: list[dict[str, Any]] = []
    for m in sample.messages:
        if m.get("role") == "assistant":
            break
        head.append(m)
    return head


def prompt_rows(chain: Chain, samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """One GRPO row per train task: ``prompt`` (the rendered chat, ready for generation) and
    ``task_id``; the opening and tools come from the task's first sample that has them, else
    the kept layers' system prompt and the request."""
    tokenizer = chain.pool.pool.tokenizer
    env, _ = chain.kept()
    rows: list[dict[str, Any]] = []
    for task in chain.train:
        drawn = (s for s in samples if s.task == task.task_id and _opening(s))
        sample = next(drawn, None)
        if sample is not None:
            opening, tools = _opening(sample), sample.tools
        else:
            opening = [
                {"role": "system", "content": env.system_prompt()},
                {"role": "user", "content": task.request},
            ]
            tools = tool_schemas(chain.world.tools_for(task))
        text = tokenizer.apply_chat_template(
            opening, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        rows.append({"prompt": str(text), "task_id": task.task_id})
    return rows


def grpo_config(chain: Chain, init_adapter: str | None) -> GRPORunConfig:
    """The chain's GRPO config: one prompt per step, ``grpo_generations`` completions each."""
    s = chain.settings
    return GRPORunConfig(
        **chain.run_options(),
        init_adapter=init_adapter,
        max_steps=s.grpo_steps,
        learning_rate=s.grpo_learning_rate,
        num_generations=s.grpo_generations,
        batch_size=s.grpo_generations,
        max_completion_length=s.max_new_tokens,
        temperature=s.temperature,
        save_steps=max(1, s.grpo_steps // 2),
    )


def train_grpo(
    chain: Chain, start: tuple[str, int] | None, sampled: str
) -> tuple[tuple[str, int] | None, str]:
    """Train GRPO from ``start`` (the last kept adapter and its version; ``None``: a new
    LoRA on the base) with prompts from round ``sampled``'s samples; the published adapter
    (``None``: nothing trained) and what the layer is."""
    s = chain.settings
    samples = round_samples(chain, sampled)
    rows = prompt_rows(chain, samples)
    mixed = mixed_tasks(samples)
    if mixed:  # a group whose completions all get one reward has no gradient
        rows = [r for r in rows if r["task_id"] in mixed]
    init, parent = start if start is not None else (None, None)
    config = grpo_config(chain, init)
    t0 = time.perf_counter()
    what = (
        f"GRPO {s.grpo_steps} steps x {s.grpo_generations} completions, the {chain.spec.name} "
        f"checker as reward, from {f'v{parent}' if parent is not None else 'the base'}"
    )
    try:
        result = train(
            config,
            rows,
            run_dir=chain.work / "weights" / "grpo",
            reward_funcs=[checker_reward(chain.world, chain.by_id)],
            progress=chain.progress("grpo"),
        )
    except TrainingError as exc:
        chain.echo(f"  grpo: not trained ({exc})")
        return None, what
    manifest: dict[str, Any] = {
        "kind": "grpo",
        "rows": len(rows),
        "tasks": [r["task_id"] for r in rows],
        "lineage": {"method": "grpo", "init_adapter": init, "prompts_from": sampled},
    }
    version = chain.publish(result, manifest, parent)
    chain.timings["grpo training"] = time.perf_counter() - t0
    means = step_means(Path(result.run_dir), ("reward", "frac_reward_zero_std"))
    reward, flat = means["reward"], means["frac_reward_zero_std"]
    chain.echo(
        f"  grpo: {result.steps} steps on {len(rows)} train prompts "
        f"({'the tasks with mixed samples' if mixed else 'no task with mixed samples: all'}), "
        f"mean reward {reward:.3f}, "
        f"{flat:.0%} of groups all one reward (no signal) ({result.tokens_per_s:.0f} "
        f"tokens/s) -> v{version}"
    )
    return (result.adapter_dir, version), f"{what}, mean train reward {reward:.3f}"
