#!/usr/bin/env bash
# scripts/gpu_check.py on a GPU machine with its own PyTorch, within one short call (docs/gpu.md).
# Python packages the machine lacks, or has at another version than pyproject.toml pins, travel as
# wheels in .whl/ (docs/gpu.md says which and how); they go to /tmp/site, ahead of the machine's.
#   bash scripts/gpu_check.sh [OUT_DIR]    # writes OUT_DIR/gpu-check.json and OUT_DIR/gpu-check.log
set -uo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; fi
cd "$(dirname "$0")/.."
out="${1:-${OUT:-.}}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH=".:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee "$out/nvidia-smi.txt"
timeout "${GPU_CHECK_TIMEOUT_S:-420}" python3 scripts/gpu_check.py --out "$out/gpu-check.json" "${@:2}" 2>&1 | tee "$out/gpu-check.log"
