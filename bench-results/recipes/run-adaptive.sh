#!/bin/bash
# docs/results/2026-11-23-adaptive.md, its "adaptive" section:
# - poor drafts: the noise suite on the smollm2 preset, whose drafter (the verifier's first 16 of 30
#   layers) costs about half a verifier forward and lands almost nothing there: fixed draft lengths
#   against adaptive against the verifier alone;
# - the model drafter swept over fixed draft lengths against adaptive on 10 GSM8K and 10 MT-Bench
#   prompts with qwen-coder (HumanEval's sweep is in run-report.sh).
# --compile on, gRPC, one pinned core per service; about 80 minutes on 2 cores.
set -e
. "$(dirname "$0")/lib.sh"  # --help; run_folder
cd "$(dirname "$0")/../.."
out=$(run_folder adaptive)
common=(--max-new-tokens 64 --transport grpc --compile on)
specpipe bench "${common[@]}" --preset smollm2 --suite noise --limit 12 \
  --methods model:sequential/4,model:branch/4,model:sequential/8+adaptive,model:branch/8+adaptive,hybrid:branch/8+adaptive \
  --json "$out"/poor-noise-smollm2.json
qwen=(--preset qwen-coder --draft-weights bf16 --methods model:branch --sweep 2,4,6,8)
specpipe bench "${common[@]}" "${qwen[@]}" --suite gsm8k --limit 10 --json "$out"/sweep-gsm8k.json
specpipe bench "${common[@]}" "${qwen[@]}" --suite mtbench --limit 10 --json "$out"/sweep-mtbench.json
specpipe bench --report "$out"/poor-noise-smollm2.json "$out"/sweep-gsm8k.json "$out"/sweep-mtbench.json \
  --readme docs/results/${RECORD:-2026-11-23-adaptive}.md --section adaptive --plot-dir "$out"/plots
