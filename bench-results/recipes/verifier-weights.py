"""The verifier alone and the default speculation with one --verifier-weights (and --draft-weights) setting,
in a process of its own (so its peak resident memory is that setting's, load included), the two arms in turn on every
prompt (the order alternating); each arm's output must equal the other's (lossless against this
verifier). Run it once per setting, back to back, and compare the JSON files (outputs included).

    for w in fp32 bf16 int8 w8a8; do
      python3 bench-results/recipes/verifier-weights.py --verifier-weights $w --suite humaneval --limit 4 \\
        --json out/$w.json
    done
    python3 bench-results/recipes/verifier-weights.py --draft-weights w8a8 --json out/draft-w8a8.json
"""

import json
import resource
import time
from dataclasses import replace

from arms import arm_parser, arm_prompts

from specpipe.app.wiring import embedded_generator
from specpipe.config.services import DRAFT_WEIGHTS, VERIFIER_WEIGHTS, generator_config
from specpipe.core.types import GenerationRequest

parser = arm_parser(__doc__, limit=4)
parser.add_argument("--verifier-weights", default="fp32", choices=VERIFIER_WEIGHTS)
parser.add_argument("--draft-weights", default="auto", choices=DRAFT_WEIGHTS)
parser.set_defaults(suite="humaneval")
args = parser.parse_args()

started = time.perf_counter()
config = generator_config({"preset": args.preset, "verifier_weights": args.verifier_weights,
                           "draft_weights": args.draft_weights})
generator = embedded_generator(config)
load_s = time.perf_counter() - started
load_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
arms = {"verifier alone": replace(config.speculation, drafter="none"), "default": config.speculation}
rows, totals = [], {arm: [0.0, 0] for arm in arms}
for i, prompt in enumerate(arm_prompts(args)):
    ids = generator.encode(messages=prompt.messages)
    outputs = {}
    for arm in list(arms) if i % 2 == 0 else list(reversed(arms)):
        start = time.perf_counter()
        chunks = list(generator.generate(GenerationRequest(ids, args.max_new_tokens, speculation=arms[arm])))
        seconds = time.perf_counter() - start
        outputs[arm] = [t for chunk in chunks for t in chunk.token_ids]
        totals[arm][0] += seconds
        totals[arm][1] += len(outputs[arm])
        rows.append({"prompt": prompt.id, "arm": arm, "tokens": len(outputs[arm]), "seconds": seconds,
                     "token_ids": outputs[arm]})
        print(f"{prompt.id} {arm}: {len(outputs[arm]) / seconds:.2f} tokens/s", flush=True)
    assert outputs["default"] == outputs["verifier alone"], f"{prompt.id}: speculation changed the output"
summary = {arm: {"tokens": n, "seconds": s, "tokens_per_s": n / s} for arm, (s, n) in totals.items()}
peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"verifier_weights": args.verifier_weights, "draft_weights": args.draft_weights, "load_s": load_s,
                  "load_peak_rss_mb": load_rss_mb,
                  "peak_rss_mb": peak_rss_mb, **{arm: row["tokens_per_s"] for arm, row in summary.items()}}))
if args.json:
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "load_s": load_s, "load_peak_rss_mb": load_rss_mb, "peak_rss_mb": peak_rss_mb,
                   "summary": summary, "prompts": rows}, f, indent=1)
