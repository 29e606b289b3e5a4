"""Interleaved A/B of a drafter head over part of the vocabulary (FR-Spec's idea): the small model's
logits computed only for the first V token ids (BPE numbers its tokens in merge order, roughly by
frequency) and its end-of-sequence ids, -inf elsewhere; verification unchanged, so every arm's output
must be the same. qwen-coder (the hybrid default), one process, each arm on a generator of its own, the
arms in turn on every prompt (the order alternating). Not in the product: it lost (docs/results/
2026-11-27-kernel.md).

    python3 bench-results/recipes/draft-vocab-ab.py --suite mtbench --limit 4 --sizes 0,32768,65536
"""

import math

import torch
from arms import arm_parser, arm_prompts, run_arms, write_json
from torch import nn

from specpipe.app.wiring import embedded_generator
from specpipe.config.services import generator_config
from specpipe.engine import native


class VocabHead(nn.Module):
    """A packed lm_head (specpipe.engine.native.PackedLinear) over the first `size` ids (whole panels)
    and the ids in extra; -inf elsewhere."""

    def __init__(self, head: native.PackedLinear, size: int, extra: list[int]):
        super().__init__()
        panel = head.packed.shape[2]
        self.main = head.packed[: math.ceil(size / panel)]                     # a view: no copy
        self.size, self.vocab = self.main.shape[0] * panel, head.out_features
        self.extra = torch.tensor(extra)
        self.extra_weight = torch.stack([head.packed[i // panel, :, i % panel].float() for i in extra])  # [E, K]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        out = torch.full((rows.shape[0], self.vocab), -math.inf)
        out[:, : self.size] = native.packed_linear(rows, self.main, self.size)
        out[:, self.extra] = rows @ self.extra_weight.T
        return out.view(*x.shape[:-1], self.vocab)


parser = arm_parser(__doc__, limit=4)
parser.add_argument("--sizes", default="0,32768,65536", help="the arms: V (0 = the whole vocabulary)")
args = parser.parse_args()

sizes = [int(s) for s in args.sizes.split(",")]
config = generator_config({"preset": args.preset})
generators = {}
for size in sizes:
    generator = embedded_generator(config)
    if size:
        drafter = generator.drafters["model"]
        drafter.model.lm_head = VocabHead(drafter.model.lm_head, size, list(drafter.info().eos_token_ids))
    generators[size] = generator
prompts = arm_prompts(args)
rows, summary = run_arms(generators, prompts, args.max_new_tokens, config.speculation, "size")
write_json(args.json, args, summary, rows)
