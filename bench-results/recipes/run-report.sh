#!/bin/bash
# docs/results/2026-11-23-alternatives.md: each suite with every transformers baseline and specpipe's methods in one run,
# the model drafter swept over fixed draft lengths against adaptive (the sweep), then the random
# suite (poor drafts) and the report (tables and plots, written into that record).
# qwen-coder, --compile on, bf16 drafter weights, gRPC, one pinned core per service. 5 to 7 minutes
# per prompt on 2 cores (13 methods), ~2 hours in all: hence 10 HumanEval, 5 GSM8K, 2 MT-Bench prompts
# (both turns) and 3 random ones.
set -e
. "$(dirname "$0")/lib.sh"  # --help; run_folder
cd "$(dirname "$0")/../.."
out=$(run_folder alternatives)
common=(--preset qwen-coder --max-new-tokens 64 --transport grpc --compile on --draft-weights bf16)
methods=(--baselines generate,generate-threads,assisted,prompt-lookup --sweep 2,4,6,8
         --methods ngram:sequential/4,model:branch,hybrid:branch/4,hybrid:branch/8+adaptive)
specpipe bench "${common[@]}" "${methods[@]}" --suite humaneval --limit 10 --json "$out"/report-humaneval.json
specpipe bench "${common[@]}" "${methods[@]}" --suite gsm8k --limit 5 --json "$out"/report-gsm8k.json
specpipe bench "${common[@]}" "${methods[@]}" --suite mtbench --limit 2 --turns 2 --json "$out"/report-mtbench.json
specpipe bench "${common[@]}" --suite random --limit 3 --methods model:branch/4,model:branch/8+adaptive,hybrid:branch/8+adaptive \
  --json "$out"/report-random.json
specpipe bench --report "$out"/report-humaneval.json "$out"/report-gsm8k.json \
  "$out"/report-mtbench.json "$out"/report-random.json --readme docs/results/${RECORD:-2026-11-23-alternatives}.md --plot-dir "$out"/plots
