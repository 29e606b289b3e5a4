#!/bin/bash
# The served pipeline at GPU speed (docs/pipeline.md): `specpipe loadtest` against `specpipe up --pin` whose verifier
# (and drafter) forwards are held to the packaged H200 curve, the tiny preset (its forward computes every token) and
# qwen-coder replayed from a transcript of its greedy decoding (recorded first when missing: `specpipe transcript
# record`, about half an hour on 2 cores). Each load table ends with where the CPU goes, per level.
# LEVELS (default 1,16,32,64,128), HOLD (seconds a level, default 20), TOK (new tokens, default 128), ORCH
# (orchestrator replicas, default 1), LOADPROCS (Locust processes, default 1: `--load-processes`; every level a
# multiple of it, e.g. LEVELS=16,32,64,128 LOADPROCS=4 where the load needs several cores), DRAFTERS (default
# none,ngram), STALL (the verifier's --prefill-stall, default its own), RUNS (default "tiny replay"). Writes bench-results/<today>-gpu-speed-load/ (or $OUT).
. "$(dirname "$0")/lib.sh"  # --help; run_folder
set -e
cd "$(dirname "$0")/../.."
out=$(run_folder gpu-speed-load)
levels=${LEVELS:-1,16,32,64,128}; hold=${HOLD:-20}; tok=${TOK:-128}; orch=${ORCH:-1}; loadprocs=${LOADPROCS:-1}
drafters=${DRAFTERS:-none,ngram}
transcript=${TRANSCRIPT:-$out/qwen-coder-mix-20x128.json.gz}
verifier_flags=${STALL:+--verifier-flags=--prefill-stall=$STALL}
for run in ${RUNS:-tiny replay}; do
  up="--pin --orchestrators $orch --cost-model nvidia-h200-qwen-coder $verifier_flags"
  preset=tiny
  if [ "$run" = replay ]; then
    preset=qwen-coder
    [ -f "$transcript" ] || specpipe transcript record --preset qwen-coder --suite mix --prompt-limit 20 \
      --max-new-tokens 128 --out "$transcript"
    up="$up --replay $transcript"
  fi
  specpipe loadtest --preset $preset --up-args="$up" --shape steps --levels "$levels" --hold-s "$hold" \
    --max-new-tokens "$tok" --drafter "$drafters" --load-processes "$loadprocs" --deadline-s 600 --out "$out/$run" \
    --json > "$out/$run.json"
done
