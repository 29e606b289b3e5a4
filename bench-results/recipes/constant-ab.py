"""Interleaved A/B of one module constant (STOP_CONFIDENCE, WARM_LAG, ...) in the default configuration,
one process: each arm on a generator of its own, the constant set to the arm's value ahead of its turn,
the arms in turn on every prompt (the order alternating), so a host's drift hits all; every arm's output
must be the same. Name the constant where it is read (the module that uses it at call time).

    python3 bench-results/recipes/constant-ab.py --constant orchestrator.generator.STOP_CONFIDENCE \
        --values 0,0.4 --suite mtbench --limit 8
    python3 bench-results/recipes/constant-ab.py --constant orchestrator.schedules.WARM_LAG \
        --values 32,1000000 --prompts bench-results/recipes/outside-prompts.jsonl
    python3 bench-results/recipes/constant-ab.py --constant orchestrator.adaptive.EVIDENCE_SOURCES \
        --values "global;global,context" --suite humaneval --limit 5

A tuple constant's arms are separated by ';', its items by ','.
"""

import importlib

from arms import arm_parser, arm_prompts, run_arms, write_json

from specpipe.app.wiring import embedded_generator
from specpipe.config.services import generator_config

parser = arm_parser(__doc__)
parser.add_argument("--constant", required=True, help="MODULE.NAME, e.g. orchestrator.schedules.WARM_LAG")
parser.add_argument("--values", required=True, help="the arms: the constant's values, comma-separated")
args = parser.parse_args()

module_name, _, name = args.constant.rpartition(".")
module = importlib.import_module(module_name)
kind = type(getattr(module, name))
if kind is tuple:
    values = [tuple(item for item in v.split(",") if item) for v in args.values.split(";")]
else:
    values = [kind(v) for v in args.values.split(",")]
config = generator_config({"preset": args.preset})
generators = {value: embedded_generator(config) for value in values}
prompts = arm_prompts(args)
rows, summary = run_arms(generators, prompts, args.max_new_tokens, config.speculation, name,
                        before=lambda value: setattr(module, name, value))
write_json(args.json, args, summary, rows)
