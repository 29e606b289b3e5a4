#!/bin/bash
# A lone session with the default (hybrid) drafter, the one-session-per-forward services
# (--batching off) against the batched ones (docs/results/2026-11-25-load-curve-256-tokens.md, "A lone session, batched and
# unbatched"): `specpipe up --pin`, one user, 256-token answers.
# Default: a loadtest level of one user, each service's metrics scraped around each run
# (python3 bench-results/recipes/metrics-delta.py DIR off on prints what changed). TRACE=1: instead, the mix suite's first N
# prompts one after another, every round's statistics written by bench-results/recipes/lone-trace.py
# (python3 bench-results/recipes/lone-trace-summary.py OUT/trace-off.jsonl OUT/trace-on.jsonl sums them per prompt).
. "$(dirname "$0")/lib.sh"  # --help; run_folder
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$(cd "$HERE/../.." && pwd); OUT=${OUT:-/tmp/lone}; HOLD=${HOLD:-150}; N=${N:-6}
mkdir -p $OUT
scrape() { for p in 51100 51101 51102; do curl -s 127.0.0.1:$p/metrics | grep -E "^specpipe_" | grep -v _bucket | sed "s/^/$p:/"; done; }
for mode in ${MODES:-off on}; do
  PYTHONPATH=$TREE python3 -m specpipe.cli.main up --preset qwen-coder --pin --batching $mode --base-port 51000 --log-dir $OUT/logs-$mode > $OUT/up-$mode.log 2>&1 &
  UP=$!
  for i in $(seq 1 120); do python3 -c "import grpc; ch=grpc.insecure_channel('127.0.0.1:51000'); grpc.channel_ready_future(ch).result(timeout=2)" 2>/dev/null && break; sleep 3; done
  sleep 5
  if [ -n "$TRACE" ]; then
    PYTHONPATH=$TREE python3 $TREE/bench-results/recipes/lone-trace.py 127.0.0.1:51000 $OUT/trace-$mode.jsonl $N > $OUT/trace-$mode.log 2>&1
    echo "== $mode"; cat $OUT/trace-$mode.log
  else
    scrape > $OUT/before-$mode.txt
    PYTHONPATH=$TREE python3 -m specpipe.cli.main loadtest --addr 127.0.0.1:51000 --levels 1 --hold-s $HOLD --max-new-tokens 256 --deadline-s 900 --suite mix --out $OUT/$mode > $OUT/loadtest-$mode.log 2>&1
    scrape > $OUT/after-$mode.txt
    echo "== $mode"; grep "^| [0-9]" $OUT/loadtest-$mode.log
  fi
  kill $UP; wait $UP
done
