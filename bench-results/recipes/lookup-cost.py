"""Time context_lookup, the context drafter's search each round, on real contexts: every prompt of a
suite (chat template, a packaged model's tokenizer) cut at every 8th token from its middle on, a chain
of up to K tokens from each cut, best of REPEATS passes. No model runs. For an A/B run it again with
PYTHONPATH=<a worktree of another revision> (the drafts must be the same: --json and compare).

    python3 bench-results/recipes/lookup-cost.py --suite humaneval --limit 20
"""

import json
import time

from arms import arm_parser, arm_prompts
from transformers import AutoTokenizer

from specpipe.core.ngram import context_lookup
from specpipe.models.packaged import model_dir

parser = arm_parser(__doc__, limit=20)
parser.add_argument("--tokenizer", default="qwen2.5-coder-1.5b", help="a packaged model's name")
parser.add_argument("--k", type=int, default=32)
parser.add_argument("--repeats", type=int, default=5)
args = parser.parse_args()

tokenizer = AutoTokenizer.from_pretrained(model_dir(args.tokenizer), local_files_only=True)
contexts = []
for prompt in arm_prompts(args):
    chat = [{"role": role, "content": content} for role, content in prompt.messages]
    ids = list(
        tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    )
    contexts += [ids[:cut] for cut in range(len(ids) // 2, len(ids) + 1, 8)]

best = float("inf")
for _ in range(args.repeats):
    start = time.perf_counter()
    drafts = [context_lookup(context, args.k, 1) for context in contexts]
    best = min(best, time.perf_counter() - start)
tokens = sum(len(found.draft.tokens) for found in drafts)
print(
    f"{len(contexts)} lookups of up to {args.k} tokens over contexts of {sum(map(len, contexts)) / len(contexts):.0f} "
    f"tokens: {best / len(contexts) * 1e3:.3f} ms a lookup, {tokens / len(contexts):.1f} tokens drafted"
)
if args.json:
    with open(args.json, "w") as f:
        json.dump({"ms_per_lookup": best / len(contexts) * 1e3, "lookups": len(contexts),
                   "drafts": [found.draft.tokens for found in drafts]}, f)
