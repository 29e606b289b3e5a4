#!/bin/bash
# Interleaved A/B of two git revisions on one `specpipe bench` command: each revision is checked out
# as a worktree and imported ahead of the installed tree (PYTHONPATH), the runs alternate (BEFORE,
# AFTER, BEFORE, ...) for PAIRS pairs, and each run's JSON goes to OUT. Hosts drift between runs, so
# compare the ratios within a run (specpipe's default over the run's own baselines), which the
# summary prints per run and averaged per revision. Run from the repository root, e.g.
#
#   BEFORE=263b08c^ AFTER=263b08c OUT=bench-results/2026-11-28-forward-plan/ab-forward-plan \
#     bash bench-results/recipes/revision-ab.sh --preset smollm2 --suite humaneval --limit 5 \
#     --max-new-tokens 128 --baselines generate-threads,prompt-lookup --prompt-lookup-tokens 10
. "$(dirname "$0")/lib.sh"  # --help; run_folder
set -euo pipefail
BEFORE=${BEFORE:-HEAD^}
AFTER=${AFTER:-HEAD}
PAIRS=${PAIRS:-3}
OUT=${OUT:?OUT: the folder for the runs\' JSON}
mkdir -p "$OUT"
trees=$(mktemp -d)
trap 'git worktree remove --force "$trees/before" 2>/dev/null; git worktree remove --force "$trees/after" 2>/dev/null; rm -rf "$trees"' EXIT
git worktree add -q --detach "$trees/before" "$BEFORE"
git worktree add -q --detach "$trees/after" "$AFTER"
for i in $(seq 1 "$PAIRS"); do
  for arm in before after; do
    PYTHONPATH="$trees/$arm" specpipe bench "$@" --json "$OUT/$arm-$i.json" > "$OUT/$arm-$i.log" 2>&1
    rm "$OUT/$arm-$i.log"
    echo "pair $i: $arm done"
  done
done
python3 - "$OUT" "$BEFORE" "$AFTER" <<'EOF'
import glob, json, sys

out, names = sys.argv[1], {"before": sys.argv[2], "after": sys.argv[3]}
for arm, revision in names.items():
    ratios: dict[str, list[float]] = {}
    for path in sorted(glob.glob(f"{out}/{arm}-*.json")):
        methods = json.load(open(path))["methods"]
        default = next(m for m in methods if m.get("default"))
        assert all(m["identical"] == m["prompts"] for m in methods), f"{path}: an output differs"
        for m in methods:
            if m is not default:
                ratios.setdefault(m["method"], []).append(default["tokens_per_s"] / m["tokens_per_s"])
    for method, values in ratios.items():
        print(f"{arm} ({revision}): specpipe's default over {method}: "
              f"{' '.join(f'{v:.3f}' for v in values)}, mean {sum(values) / len(values):.3f}")
EOF
