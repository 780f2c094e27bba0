"""A tiny Llama model and a BPE tokenizer trained on the spot: the CI-sized base model.

Nothing is downloaded: the tokenizer is trained with ``tokenizers`` on a corpus made of the
texts it will see, and the model is built from a ``LlamaConfig`` (~100K parameters), so SFT,
DPO and GRPO runs take seconds on a CPU. Its chat template is TRL's Qwen2.5 training template
(tools, ``<tool_call>`` blocks, generation markers).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evoharness.sdk.serving.base_models import training_chat_template

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tiny_model(
    directory: Path | str,
    corpus: Iterable[str],
    *,
    vocab_size: int = 512,
    hidden_size: int = 32,
    layers: int = 2,
    seed: int = 0,
) -> Path:
    """Train a tokenizer on ``corpus``, build a tiny Llama, save both to ``directory``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from tokenizers import decoders as tk_decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    raw = Tokenizer(models.BPE(unk_token=None))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = tk_decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(list(corpus), trainer=trainer)
    fast: Any = PreTrainedTokenizerFast  # untyped constructor
    tok = fast(
        tokenizer_object=raw,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    tok.chat_template = training_chat_template()
    tok.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    return out
