#!/bin/bash
# The headline (README; docs/results/2026-11-30-headline-128.md and the 256-token records):
# specpipe with default flags (embedded, as `specpipe generate` runs it: --compile auto, the default
# drafter of the preset (qwen-coder: the hybrid, n-gram first; smollm2: the n-gram drafter), the branch
# schedule, adaptive control, learning; the process pinned to 2 cores, shared by the verifier and the
# drafter) against transformers on the same 2 cores and the same packed weights (generate(), assisted
# generation, prompt lookup at 4 and 10 tokens), and eager generate() on one core, labelled. 20
# HumanEval, 10 GSM8K and 8 MT-Bench prompts (every category in turn).
# PRESET (default qwen-coder, the default preset), TOKENS (new tokens, default 128), SUITES
# (default "humaneval gsm8k mtbench"), LIMITS (their prompts, default "20 10 8") and BASELINES (default
# every transformers method) change the run;
# it writes bench-results/<today>-headline-$TOKENS/$PRESET-$SUITE.json (or $OUT/), with the command, and the
# section headline-$TOKENS-$PRESET of the record page $RECORD (its name under docs/results/).
# On the 2-core AVX-512 EPYC, 128 tokens: smollm2 about 25 minutes, qwen-coder HumanEval 35 to 55 (by host);
# on the 2-core Xeon of 2026-11-27, smollm2 at 256 tokens without assisted generation 43 minutes.
# On the 2-core Zen 5 EPYC of 2026-11-29: qwen-coder HumanEval 36 minutes; at 256 tokens, GSM8K 43, MT-Bench 27.
# On the 2-core Zen 3 EPYC (AVX2) of 2026-11-28, smollm2 at 128 tokens without assisted generation 27 minutes.
# (The 48-token run of 2026-11-24 on the AVX2 host: bench-results/2026-11-24-default-48-tokens/default-*.json.)
set -e
. "$(dirname "$0")/lib.sh"  # --help; run_folder
cd "$(dirname "$0")/../.."
tokens=${TOKENS:-128}
preset=${PRESET:-qwen-coder}
suites=${SUITES:-humaneval gsm8k mtbench}
baselines=${BASELINES:-generate,generate-threads,assisted,prompt-lookup}
out=$(run_folder "headline-$tokens")
read -r he gs mt <<< "${LIMITS:-20 10 8}"
declare -A limit=([humaneval]=$he [gsm8k]=$gs [mtbench]=$mt)
files=()
for suite in $suites; do
  specpipe bench --preset "$preset" --max-new-tokens "$tokens" --baselines "$baselines" \
    --suite "$suite" --limit "${limit[$suite]}" --json "$out/$preset-$suite.json"
  files+=("$out/$preset-$suite.json")
done
# The record whose tables it rewrites (a new run's record is a new dated page: copy one, RECORD=its name).
declare -A record=([128-smollm2]=2026-11-30-headline-128 [128-qwen-coder]=2026-11-30-headline-128
                   [256-smollm2]=2026-11-27-headline-256-smollm2 [256-qwen-coder]=2026-11-30-headline-256-qwen-coder)
page=docs/results/${RECORD:-${record[$tokens-$preset]}}.md
specpipe bench --report "${files[@]}" --readme "$page" --section "headline-$tokens-$preset" \
  --plot-dir "$out/plots-$preset"
