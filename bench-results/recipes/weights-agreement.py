"""Where does the verifier on narrower packed weights pick another greedy token than on fp32? Teacher-forced,
one process: on each prompt the narrow verifier's own greedy continuation (transformers generate() on the
packed model) is fed once to both models, and at every continuation position their argmax is compared;
where they differ, fp32's margin between its two best logits is reported (a near tie, or not).

    python3 bench-results/recipes/weights-agreement.py --weights int8 --suites humaneval,mtbench,gsm8k --limit 6
"""

import argparse
import json

import torch

from orchestrator.inputs import chat_ids
from specpipe.bench.prompts import load_suite
from specpipe.config.presets import model_specs
from specpipe.engine.models import load_model, load_tokenizer
from specpipe.engine.runner import PACKED_WEIGHTS

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--preset", default="qwen-coder")
parser.add_argument("--weights", default="int8", choices=[w for w in PACKED_WEIGHTS if w != "fp32"])
parser.add_argument("--suites", default="humaneval,mtbench,gsm8k")
parser.add_argument("--limit", type=int, default=6, help="prompts per suite")
parser.add_argument("--max-new-tokens", type=int, default=128)
parser.add_argument("--json", default=None)
args = parser.parse_args()


def greedy(model: torch.nn.Module, ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


spec = model_specs(args.preset)[0]
tokenizer = load_tokenizer(spec)
fp32, narrow = load_model(spec, packed="fp32"), load_model(spec, packed=args.weights)
rows = []
for suite in args.suites.split(","):
    for prompt in load_suite(suite, args.limit):
        ids = list(chat_ids(tokenizer, prompt.messages))
        continuation = greedy(narrow, ids, args.max_new_tokens)
        with torch.inference_mode():
            batch = torch.tensor([ids + continuation[:-1]])
            first = len(ids) - 1  # the logits that chose the continuation's first token
            a, b = (model(batch).logits[0, first:] for model in (fp32, narrow))
        differ = (a.argmax(-1) != b.argmax(-1)).nonzero().flatten().tolist()
        margins = [float(torch.topk(a[i], 2).values.diff().abs()) for i in differ]
        rows.append({"suite": suite, "prompt": prompt.id, "positions": len(continuation), "differ": differ,
                     "fp32_top2_margin": margins})
        print(f"{suite} {prompt.id}: {len(differ)} of {len(continuation)} positions differ, fp32 margins {margins}",
              flush=True)
total, differing = sum(r["positions"] for r in rows), sum(len(r["differ"]) for r in rows)
print(f"{args.weights} vs fp32: {differing} of {total} positions differ; prompts with any: "
      f"{sum(bool(r['differ']) for r in rows)} of {len(rows)}")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "positions": total, "differ": differing, "prompts": rows}, f, indent=1)
