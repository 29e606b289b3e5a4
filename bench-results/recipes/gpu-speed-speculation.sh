#!/bin/bash
# Speculation under load at GPU cost against plain batched decoding (docs/pipeline.md): qwen-coder replayed from a
# transcript of its greedy decoding (its small model's drafts too), verifier and drafter held to the packaged H200
# curve, through `specpipe up --pin`; the n-gram drafter and the preset's default, the hybrid (the replayed small model
# and the store), with the store learning finished outputs (learn-on) and not (learn-off: the unique-prompt figure, as
# the suites' 20 prompts repeat under load) beside no drafter, on HumanEval (code) and MT-Bench (chat). Then the same on the CPU as the services run there (SmolLM2, real forwards, no cost
# model, its default drafter). LEVELS (default 1,4,16,32,64), CPU_LEVELS (default 1,4,16), HOLD (default 20), TOK
# (default 128), TRANSCRIPT (default: recorded into the run's folder first). Writes bench-results/<today>-gpu-speed-
# speculation/ (or $OUT): one loadtest folder and JSON summary per suite and regime.
. "$(dirname "$0")/lib.sh"  # --help; run_folder
set -e
cd "$(dirname "$0")/../.."
out=$(run_folder gpu-speed-speculation)
levels=${LEVELS:-1,4,16,32,64}; cpu_levels=${CPU_LEVELS:-1,4,16}; hold=${HOLD:-20}; tok=${TOK:-128}
transcript=${TRANSCRIPT:-$out/qwen-coder-mix-20x128.json.gz}
[ -f "$transcript" ] || specpipe transcript record --preset qwen-coder --suite mix --prompt-limit 20 \
  --max-new-tokens 128 --out "$transcript"
gpu="--pin --cost-model nvidia-h200-qwen-coder --replay $transcript"
for suite in humaneval mtbench; do
  specpipe loadtest --preset qwen-coder --suite "$suite" --shape steps --levels "$levels" --hold-s "$hold" \
    --max-new-tokens "$tok" --deadline-s 600 --drafter none,ngram,hybrid \
    --up-args "learn-on=$gpu" --up-args "learn-off:ngram,hybrid=$gpu --learn-global off" \
    --out "$out/gpu-$suite" --json > "$out/gpu-$suite.json"
  specpipe loadtest --preset smollm2 --suite "$suite" --shape steps --levels "$cpu_levels" --hold-s "$hold" \
    --max-new-tokens "$tok" --deadline-s 900 --drafter none,default \
    --up-args "learn-on=--pin" --up-args "learn-off:default=--pin --learn-global off" \
    --out "$out/cpu-$suite" --json > "$out/cpu-$suite.json"
done
