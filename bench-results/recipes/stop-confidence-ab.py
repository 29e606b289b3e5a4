"""Interleaved A/B of the model drafter's confidence stop (orchestrator.adaptive.STOP_CONFIDENCE) in
the default configuration, one process: each arm on a generator of its own, the arms in turn on every
prompt (the order alternating), so a host's drift hits both; every arm's output must be the same.

    python3 bench-results/recipes/stop-confidence-ab.py --suite mtbench --limit 8 --stops 0,0.4
    python3 bench-results/recipes/stop-confidence-ab.py --prompts bench-results/engine-2026-11-27/outside-prompts.jsonl
"""

import argparse
import json
import time

import orchestrator.generator
from specpipe.app.wiring import embedded_generator
from specpipe.bench.prompts import load_prompts_file, load_suite
from specpipe.config.services import generator_config
from specpipe.core.types import GenerationRequest

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
rows, totals = [], {stop: [0.0, 0] for stop in stops}
prompts = load_prompts_file(args.prompts, args.limit) if args.prompts else load_suite(args.suite, args.limit)
for i, prompt in enumerate(prompts):
    ids = generators[stops[0]].encode(messages=prompt.messages)
    outputs = set()
    for stop in stops if i % 2 == 0 else stops[::-1]:
        orchestrator.generator.STOP_CONFIDENCE = stop
        start = time.perf_counter()
        chunks = list(generators[stop].generate(GenerationRequest(ids, args.max_new_tokens, speculation=config.speculation)))
        seconds = time.perf_counter() - start
        tokens = tuple(t for chunk in chunks for t in chunk.token_ids)
        rounds = [chunk.round for chunk in chunks if chunk.round is not None]
        outputs.add(tokens)
        totals[stop][0] += seconds
        totals[stop][1] += len(tokens)
        rows.append({"prompt": prompt.id, "stop": stop, "tokens": len(tokens), "seconds": seconds,
                     **{field: sum(getattr(r, field) for r in rounds) for field in ("drafted", "accepted")},
                     "rounds": len(rounds)})
        print(f"{prompt.id} stop {stop}: {len(tokens) / seconds:.2f} tokens/s", flush=True)
    assert len(outputs) == 1, f"{prompt.id}: the arms' outputs differ"
summary = {str(stop): {"tokens": n, "seconds": s, "tokens_per_s": n / s} for stop, (s, n) in totals.items()}
for stop, row in summary.items():
    print(f"stop {stop}: {row['tokens_per_s']:.3f} tokens/s over {row['tokens']} tokens")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "summary": summary, "prompts": rows}, f, indent=1)
