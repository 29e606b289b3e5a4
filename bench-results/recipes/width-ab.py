"""Interleaved A/B of the tree width (--width) in the default configuration otherwise, one process: each
arm on a generator of its own, the arms in turn on every prompt (the order alternating), so a host's
drift hits all; every arm's output must be the same.

    python3 bench-results/recipes/width-ab.py --suite mtbench --limit 8 --widths 1,2
    python3 bench-results/recipes/width-ab.py --prompts bench-results/engine-2026-11-27/outside-prompts.jsonl
"""

from dataclasses import replace

from arms import arm_parser, arm_prompts, run_arms, write_json
from specpipe.app.wiring import embedded_generator
from specpipe.config.services import generator_config

parser = arm_parser(__doc__)
parser.add_argument("--widths", default="1,2", help="the arms: tree widths (1 = a chain)")
args = parser.parse_args()

widths = [int(w) for w in args.widths.split(",")]
config = generator_config({"preset": args.preset})
generators = {width: embedded_generator(config) for width in widths}
options = {width: replace(config.speculation, width=width) for width in widths}
prompts = arm_prompts(args)
rows, summary = run_arms(generators, prompts, args.max_new_tokens, options, "width")
write_json(args.json, args, summary, rows)
