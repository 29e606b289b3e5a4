#!/bin/bash
# Warm-ups A/B (docs/results/2026-11-25-load-curve-256-tokens.md, "Warm drafters"): the code before them (a worktree of 3ffd49c:
#   git worktree add /tmp/oldtree 3ffd49c) and this checkout, `specpipe up --pin`, the model drafter
# at LEVELS users; each service's metrics scraped around each run (python3 bench-results/recipes/metrics-delta.py DIR old new --summary).
. "$(dirname "$0")/lib.sh"  # --help; run_folder
NEW_TREE=$(cd "$(dirname "$0")/../.." && pwd); OLD_TREE=${OLD_TREE:-/tmp/oldtree}
LEVELS=${LEVELS:-4,8}; HOLD=${HOLD:-90}; TOK=${TOK:-128}; OUT=${OUT:-/tmp/inv/ab}
mkdir -p $OUT
scrape() { curl -s 127.0.0.1:51100/metrics | grep -E "^specpipe_(rounds|drafted_tokens|accepted_tokens|emitted_tokens|prediction_hits|prediction_misses|hidden_draft_ms|draft_time_ms|verifier_idle_ms)_total|^specpipe_adaptive_draft_len_(sum|count)"; curl -s 127.0.0.1:51101/metrics | grep -E "^specpipe_verify_batch_(sessions|tokens)_(sum|count)"; curl -s 127.0.0.1:51102/metrics | grep -E "^specpipe_(draft_ms|draft_batch_sessions|draft_batch_tokens|queue_wait_ms)_(sum|count)|^specpipe_draft_ms_bucket"; }
for tree in ${TREES:-old new}; do
  dir=$NEW_TREE; [ $tree = old ] && dir=$OLD_TREE
  cd $dir
  PYTHONPATH=$dir python3 -m specpipe.cli.main up --preset qwen-coder --pin --base-port 51000 > $OUT/up-$tree.log 2>&1 &
  UP=$!
  for i in $(seq 1 120); do python3 -c "import grpc; ch=grpc.insecure_channel('127.0.0.1:51000'); grpc.channel_ready_future(ch).result(timeout=2)" 2>/dev/null && break; sleep 3; done
  sleep 5
  scrape > $OUT/before-$tree.txt
  PYTHONPATH=$dir python3 -m specpipe.cli.main loadtest --addr 127.0.0.1:51000 --drafter model --levels $LEVELS --hold-s $HOLD --max-new-tokens $TOK --deadline-s 900 --suite mix --out $OUT/$tree > $OUT/loadtest-$tree.log 2>&1
  scrape > $OUT/after-$tree.txt
  echo "== $tree"; grep "^| [0-9]" $OUT/loadtest-$tree.log
  kill $UP; wait $UP
done
