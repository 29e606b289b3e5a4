#!/bin/bash
# Branch prediction (docs/results/2026-11-22-branch-prediction.md): sequential vs branch, model drafter and hybrid, hop delay 0 / 2 ms (qwen-coder, grpc, one core per service).
set -e
. "$(dirname "$0")/lib.sh"  # --help; run_folder
cd "$(dirname "$0")/../.."
out=$(run_folder branch-prediction)
specpipe bench --preset qwen-coder --suite humaneval --limit 10 --max-new-tokens 64 --transport grpc \
  --methods model:sequential,model:branch,model:branch:paper,hybrid:sequential,hybrid:branch,model:sequential@2,model:branch@2 \
  --json "$out"/humaneval-qwen-coder-branch.json
specpipe bench --preset qwen-coder --suite mtbench --limit 10 --max-new-tokens 64 --transport grpc \
  --methods model:sequential,model:branch,model:branch:paper,hybrid:sequential,hybrid:branch \
  --json "$out"/mtbench-qwen-coder-branch.json
