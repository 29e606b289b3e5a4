#!/bin/bash
# Issue 5's bench: the model drafter with the branch schedule at fixed draft lengths 1, 2, 4, 6, 8 and adaptive
# (k <= 8), on every suite and on the random suite where drafts are poor; qwen-coder, --compile on,
# bf16 drafter weights, gRPC, one core per service.
set -e
cd "$(dirname "$0")/.."
for suite in humaneval mtbench gsm8k random; do
  specpipe bench --preset qwen-coder --suite "$suite" --limit 10 --max-new-tokens 64 --transport grpc \
    --compile on --draft-weights bf16 --methods model:branch --sweep 1,2,4,6,8 \
    --json "bench-results/$suite-qwen-coder-sweep.json"
done
