#!/bin/bash
# What the shell recipes share (each sources it first): `--help` prints the recipe's header comment;
# run_folder QUESTION makes the run's folder, bench-results/<today>-QUESTION/ (or $OUT), and writes
# the exact command into it (command.txt: the recipe, its arguments, the variables it reads, the commit).
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
  exit 0
fi
RECIPE_COMMAND="bash bench-results/recipes/$(basename "$0")$(printf ' %q' "$@")"

run_folder() {
  local folder=${OUT:-bench-results/$(date +%F)-$1}
  mkdir -p "$folder"
  {
    echo "# $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    env | grep -E '^(PRESET|TOKENS|SUITES|LIMITS|BASELINES|RECORD|OUT|BEFORE|AFTER|PAIRS|MODES|LEVELS|HOLD|TOK|N|TRACE|ORCH|LOADPROCS|DRAFTERS|STALL|RUNS)=' | sort
    echo "$RECIPE_COMMAND"
  } > "$folder/command.txt"
  echo "$folder"
}
