"""Interleaved A/B of the model drafter's confidence stop (orchestrator.adaptive.STOP_CONFIDENCE) in
the default configuration, one process: each arm on a generator of its own, the arms in turn on every
prompt (the order alternating), so a host's drift hits both; every arm's output must be the same.

    python3 bench-results/recipes/stop-confidence-ab.py --suite mtbench --limit 8 --stops 0,0.4
    python3 bench-results/recipes/stop-confidence-ab.py --prompts bench-results/engine-2026-11-27/outside-prompts.jsonl
"""

import argparse

import orchestrator.generator
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
parser.add_argument("--stops", default="0,0.4", help="the arms: STOP_CONFIDENCE values (0 = no stop)")
parser.add_argument("--json", default=None, help="write the per-prompt results here")
args = parser.parse_args()

stops = [float(s) for s in args.stops.split(",")]
config = generator_config({"preset": args.preset})
generators = {stop: embedded_generator(config) for stop in stops}
prompts = load_prompts_file(args.prompts, args.limit) if args.prompts else load_suite(args.suite, args.limit)
rows, summary = run_arms(generators, prompts, args.max_new_tokens, config.speculation, "stop",
                        before=lambda stop: setattr(orchestrator.generator, "STOP_CONFIDENCE", stop))
write_json(args.json, args, summary, rows)
