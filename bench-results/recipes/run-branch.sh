#!/bin/bash
# Issue 4's bench: sequential vs branch, model drafter and hybrid, hop delay 0 / 2 ms (qwen-coder, grpc, one core per service).
set -e
cd "$(dirname "$0")/../.."
specpipe bench --preset qwen-coder --suite humaneval --limit 10 --max-new-tokens 64 --transport grpc \
  --methods model:sequential,model:branch,model:branch:paper,hybrid:sequential,hybrid:branch,model:sequential@2,model:branch@2 \
  --json bench-results/humaneval-qwen-coder-branch.json
specpipe bench --preset qwen-coder --suite mtbench --limit 10 --max-new-tokens 64 --transport grpc \
  --methods model:sequential,model:branch,model:branch:paper,hybrid:sequential,hybrid:branch \
  --json bench-results/mtbench-qwen-coder-branch.json
