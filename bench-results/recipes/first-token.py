"""Time to the first token where the first round drafts nothing (k = 0: adaptive control off,
draft_len 0, the default drafter otherwise, so the drafter is warmed with the prompt), beside the
verifier alone, in turn on every prompt, one process. The orchestrator is the one on the path: run
it again with PYTHONPATH=<a worktree of another revision> for an A/B.

    python3 bench-results/recipes/first-token.py --verifier-weights bf16
"""

import json
import time
from dataclasses import replace

from arms import arm_parser, arm_prompts

from specpipe.app.wiring import embedded_generator
from specpipe.config.services import generator_config
from specpipe.core.types import GenerationRequest

parser = arm_parser(__doc__, limit=3)
parser.add_argument("--verifier-weights", default="fp32", choices=("fp32", "bf16", "int8"))
parser.set_defaults(suite="humaneval", max_new_tokens=16)
args = parser.parse_args()

config = generator_config({"preset": args.preset, "verifier_weights": args.verifier_weights})
generator = embedded_generator(config)
arms = {"k=0": replace(config.speculation, draft_len=0, adaptive="off"),
        "verifier alone": replace(config.speculation, drafter="none")}
rows = []
for i, prompt in enumerate(arm_prompts(args)):
    ids = generator.encode(messages=prompt.messages)
    outputs = set()
    for arm in (list(arms) if i % 2 == 0 else list(reversed(arms))):
        start = time.perf_counter()
        chunks = generator.generate(GenerationRequest(ids, args.max_new_tokens, speculation=arms[arm]))
        first = next(chunks)
        first_s = time.perf_counter() - start
        rest = list(chunks)
        seconds = time.perf_counter() - start
        outputs.add(tuple(t for chunk in [first, *rest] for t in chunk.token_ids))
        rows.append({"prompt": prompt.id, "arm": arm, "first_token_ms": first_s * 1e3, "seconds": seconds,
                     "prefill_ms": first.round.prefill_ms if first.round is not None else None})
        print(f"{prompt.id} {arm}: first token {first_s * 1e3:.0f} ms, prefill call {rows[-1]['prefill_ms']:.0f} ms, "
              f"all {seconds:.2f} s", flush=True)
    assert len(outputs) == 1, f"{prompt.id}: the arms' outputs differ"
if args.json:
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "prompts": rows}, f, indent=1)
