"""Interleaved A/B of the model drafter's confidence stop (orchestrator.adaptive.STOP_CONFIDENCE) in
the default configuration, one process: each arm on a generator of its own, the arms in turn on every
prompt (the order alternating), so a host's drift hits both; every arm's output must be the same.

    python3 bench-results/recipes/stop-confidence-ab.py --suite mtbench --limit 8 --stops 0,0.4
    python3 bench-results/recipes/stop-confidence-ab.py --prompts bench-results/engine-2026-11-27/outside-prompts.jsonl
"""

import orchestrator.generator
from arms import arm_parser, arm_prompts, run_arms, write_json
from specpipe.app.wiring import embedded_generator
from specpipe.config.services import generator_config

parser = arm_parser(__doc__)
parser.add_argument("--stops", default="0,0.4", help="the arms: STOP_CONFIDENCE values (0 = no stop)")
args = parser.parse_args()

stops = [float(s) for s in args.stops.split(",")]
config = generator_config({"preset": args.preset})
generators = {stop: embedded_generator(config) for stop in stops}
prompts = arm_prompts(args)
rows, summary = run_arms(generators, prompts, args.max_new_tokens, config.speculation, "stop",
                        before=lambda stop: setattr(orchestrator.generator, "STOP_CONFIDENCE", stop))
write_json(args.json, args, summary, rows)
