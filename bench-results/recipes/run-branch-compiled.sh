#!/bin/bash
# Branch prediction (docs/results/2026-11-22-branch-prediction.md) with --compile on and bf16 drafter weights: sequential vs branch, both predictors,
# hop delays 0 / 2 / 20 ms (HumanEval), model and hybrid drafters (MT-Bench); qwen-coder, gRPC, one core per service.
set -e
. "$(dirname "$0")/lib.sh"  # --help; run_folder
cd "$(dirname "$0")/../.."
out=$(run_folder branch-prediction-compiled)
specpipe bench --preset qwen-coder --suite humaneval --limit 10 --max-new-tokens 64 --transport grpc \
  --compile on --draft-weights bf16 \
  --methods model:sequential,model:branch,model:branch:paper,model:sequential@2,model:branch@2,model:sequential@20,model:branch@20 \
  --json "$out"/humaneval-qwen-coder-branch-compiled.json
specpipe bench --preset qwen-coder --suite mtbench --limit 10 --max-new-tokens 64 --transport grpc \
  --compile on --draft-weights bf16 \
  --methods model:sequential,model:branch,model:branch:paper,hybrid:sequential,hybrid:branch \
  --json "$out"/mtbench-qwen-coder-branch-compiled.json
