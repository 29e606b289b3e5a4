#!/usr/bin/env bash
# Soak: steady users against a `specpipe up` of its own for SOAK_S seconds (default 600), each
# service's resident memory sampled every 5 s. Prints the per-level table and the memory table
# (first / last third of the run after warm-up, growth, slope); exits 1 on any failed request.
#   scripts/soak.sh                        # 10 minutes, tiny preset, 4 users
#   SOAK_S=120 scripts/soak.sh             # a short one
#   PRESET=qwen-coder USERS=8 scripts/soak.sh --up-args "--compile on --pin"
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SOAK_S="${SOAK_S:-600}"
exec python3 -m specpipe.cli.main loadtest --preset "${PRESET:-tiny}" --shape constant --users "${USERS:-4}" \
  --run-time "$SOAK_S" --memory-every 5 --warmup-s "$(( SOAK_S < 240 ? SOAK_S / 4 : 60 ))" \
  ${OUT:+--out "$OUT"} "$@"   # OUT: where Locust's CSV / HTML, the records and memory.jsonl go (default: a temp dir)
