#!/bin/bash
# The headline (README, docs/results "The default configuration against baselines on equal footing"):
# specpipe with default flags (embedded, as `specpipe generate` runs it: --compile auto, the n-gram
# drafter, the branch schedule, adaptive control; the process pinned to 2 cores, shared by the
# verifier and the drafter) against transformers on the same 2 cores and the same packed weights
# (generate(), assisted generation, prompt lookup at 4 and 10 tokens), and eager generate() on one
# core, labelled. 20 HumanEval, 10 GSM8K and 8 MT-Bench prompts (every category in turn).
# PRESET (default qwen-coder, the default preset) and TOKENS (new tokens, default 48) change the run.
# On the 2-core AVX2 host qwen-coder takes about 80 minutes (38 of them HumanEval), smollm2 about 16.
# Another preset writes default-$PRESET-*.json and the docs/results section default-$PRESET.
set -e
cd "$(dirname "$0")/../.."
tokens=${TOKENS:-48}
preset=${PRESET:-qwen-coder}
name=default
if [ "$preset" != qwen-coder ]; then name=default-$preset; fi
common=(--preset "$preset" --max-new-tokens "$tokens" --baselines generate,generate-threads,assisted,prompt-lookup)
specpipe bench "${common[@]}" --suite humaneval --limit 20 --json "bench-results/$name-humaneval.json"
specpipe bench "${common[@]}" --suite gsm8k --limit 10 --json "bench-results/$name-gsm8k.json"
specpipe bench "${common[@]}" --suite mtbench --limit 8 --json "bench-results/$name-mtbench.json"
specpipe bench --report "bench-results/$name-humaneval.json" "bench-results/$name-gsm8k.json" \
  "bench-results/$name-mtbench.json" --readme docs/results/README.md --section "$name" --plot-dir "bench-results/plots-$name"
