"""Interleaved A/B of the tree width (--width) in the default configuration otherwise, one process: each
arm on a generator of its own, the arms in turn on every prompt (the order alternating), so a host's
drift hits all; every arm's output must be the same.

    python3 bench-results/recipes/width-ab.py --suite mtbench --limit 8 --widths 1,2
    python3 bench-results/recipes/width-ab.py --prompts bench-results/engine-2026-11-27/outside-prompts.jsonl
"""

import argparse
from dataclasses import replace

from arms import run_arms, write_json
from specpipe.app.wiring import embedded_generator
from specpipe.bench.prompts import load_prompts_file, load_suite
from specpipe.config.services import generator_config

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--preset", default="qwen-coder")
parser.add_argument("--suite", default="mtbench")
parser.add_argument("--prompts", default=None, help="a JSONL prompt file instead of --suite")
parser.add_argument("--limit", type=int, default=8)
parser.add_argument("--max-new-tokens", type=int, default=128)
parser.add_argument("--widths", default="1,2", help="the arms: tree widths (1 = a chain)")
parser.add_argument("--json", default=None, help="write the per-prompt results here")
args = parser.parse_args()

widths = [int(w) for w in args.widths.split(",")]
config = generator_config({"preset": args.preset})
generators = {width: embedded_generator(config) for width in widths}
options = {width: replace(config.speculation, width=width) for width in widths}
prompts = load_prompts_file(args.prompts, args.limit) if args.prompts else load_suite(args.suite, args.limit)
rows, summary = run_arms(generators, prompts, args.max_new_tokens, options, "width")
write_json(args.json, args, summary, rows)
