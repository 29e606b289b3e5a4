#!/bin/bash
# The README's "Against the alternatives" results: every suite with every transformers baseline and
# specpipe's methods in one run each, then the report (tables and plots, written into README.md).
# qwen-coder, --compile on, bf16 drafter weights, gRPC, one pinned core per service; ~2 hours on 2 cores.
set -e
cd "$(dirname "$0")/.."
common=(--preset qwen-coder --max-new-tokens 64 --transport grpc --compile on --draft-weights bf16
        --baselines generate,generate-threads,assisted,prompt-lookup
        --methods ngram:sequential,model:branch,hybrid:branch,model:branch/8+adaptive,hybrid:branch/8+adaptive)
specpipe bench "${common[@]}" --suite humaneval --limit 10 --json bench-results/report-humaneval.json
specpipe bench "${common[@]}" --suite mtbench --limit 8 --turns 2 --json bench-results/report-mtbench.json
specpipe bench "${common[@]}" --suite gsm8k --limit 10 --json bench-results/report-gsm8k.json
specpipe bench --report bench-results/report-humaneval.json bench-results/report-mtbench.json \
  bench-results/report-gsm8k.json --readme README.md --plot-dir bench-results/plots
