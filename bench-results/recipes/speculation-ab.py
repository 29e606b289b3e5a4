"""Interleaved A/B of one speculation option (a field of SpeculationOptions: draft_len, width, ...) in
the default configuration otherwise, one process: each arm on a generator of its own, the arms in turn
on every prompt (the order alternating), so a host's drift hits all; every arm's output must be the same.

    python3 bench-results/recipes/speculation-ab.py --field width --values 1,2 --suite mtbench --limit 8
    python3 bench-results/recipes/speculation-ab.py --field draft_len --values 8,16 --suite humaneval
    python3 bench-results/recipes/speculation-ab.py --field width --values 1,2 \
        --prompts bench-results/recipes/outside-prompts.jsonl
"""

from dataclasses import fields, replace

from arms import arm_parser, arm_prompts, run_arms, write_json

from specpipe.app.wiring import embedded_generator
from specpipe.config.services import generator_config
from specpipe.core.types import SpeculationOptions

parser = arm_parser(__doc__)
parser.add_argument("--field", required=True, choices=[f.name for f in fields(SpeculationOptions)])
parser.add_argument("--values", required=True, help="the arms: the field's values, comma-separated")
args = parser.parse_args()

config = generator_config({"preset": args.preset})
kind = type(getattr(config.speculation, args.field))
values = [kind(v) for v in args.values.split(",")]
generators = {value: embedded_generator(config) for value in values}
options = {value: replace(config.speculation, **{args.field: value}) for value in values}
prompts = arm_prompts(args)
rows, summary = run_arms(generators, prompts, args.max_new_tokens, options, args.field)
write_json(args.json, args, summary, rows)
