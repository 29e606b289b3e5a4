"""Interleaved A/B of one option of the process's configuration (a CLI option generator_config reads:
draft_weights, verifier_weights, compile, ...) in the default configuration otherwise, one process: each
arm on a generator of its own, the arms in turn on every prompt (the order alternating), so a host's
drift hits all; every arm's output must be the same.

    python3 bench-results/recipes/config-ab.py --option draft_weights --values bf16,int8 --suite mtbench
"""

from arms import arm_parser, arm_prompts, run_arms, write_json

from specpipe.app.wiring import embedded_generator
from specpipe.config.services import generator_config

parser = arm_parser(__doc__)
parser.add_argument(
    "--option", required=True, help="the option's name as generator_config reads it, e.g. draft_weights"
)
parser.add_argument("--values", required=True, help="the arms: the option's values, comma-separated")
args = parser.parse_args()

configs = {value: generator_config({"preset": args.preset, args.option: value}) for value in args.values.split(",")}
generators = {value: embedded_generator(config) for value, config in configs.items()}
speculation = next(iter(configs.values())).speculation
prompts = arm_prompts(args)
rows, summary = run_arms(generators, prompts, args.max_new_tokens, speculation, args.option)
write_json(args.json, args, summary, rows)
