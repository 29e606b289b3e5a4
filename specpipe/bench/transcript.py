"""Recording a replay transcript (specpipe.core.transcript; docs/pipeline.md, "Replay"): a preset's
verifier decodes the load test's prompts greedily, and one teacher-forced forward over each prompt and
its continuation gives the entropy at every position (what adaptive control reads) and checks the
continuation against the forward's own argmax; one of the small model gives its likeliest tokens at
every position (what the replayed drafter drafts).

The continuation comes from the embedded default (speculative, and so token for token the verifier's
own greedy decoding: the golden tests), which is several times faster on a CPU than decoding alone.
The prompts are the ones the load test sends: a suite's (or the mix's) first prompt_limit, as chat
messages through the orchestrator's own encoding."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specpipe.bench.prompts import Prompt, load_suite
from specpipe.config.services import GeneratorConfig
from specpipe.core.transcript import DRAFT_TOP, Entry, Transcript
from specpipe.core.types import GenerationRequest
from specpipe.engine.planner import attention_weight

MIX = ("humaneval", "mtbench", "gsm8k")  # the load test's mix (deploy/locust/locustfile.py)
FORCE_CHUNK = 128  # positions per teacher-forced forward


@dataclass(frozen=True)
class Recorded:
    transcript: Transcript
    disagreements: int   # continuation tokens that the teacher-forced forward's argmax differs from (near ties)
    tokens: int


def suite_prompts(suite: str, limit: int) -> list[Prompt]:
    """The prompts the load test sends with --suite suite --prompt-limit limit."""
    suites = MIX if suite == "mix" else (suite,)
    return [p for name in suites for p in load_suite(name, limit=limit)]


def row_entropy(logits: torch.Tensor) -> list[float]:
    """Entropy in nats of softmax of each row of logits [n, vocab]."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return (-(log_p.exp() * log_p).sum(dim=-1)).tolist()


@torch.inference_mode()
def forced_logits(model: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Iterator[torch.Tensor]:
    """The logits [n, vocab] of the distributions that chose each output token, a chunk of positions at a
    time, from forwards over the whole sequence (through the model's own cache)."""
    from transformers import DynamicCache

    sequence = [*prompt_ids, *output_ids]
    cache = DynamicCache()
    first = len(prompt_ids) - 1  # the position whose logits choose output_ids[0]
    for start in range(0, len(sequence) - 1, FORCE_CHUNK):
        ids = torch.tensor([sequence[start:min(start + FORCE_CHUNK, len(sequence) - 1)]])
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0]  # [n, vocab]
        wanted = logits[max(0, first - start):]
        if len(wanted):
            yield wanted


def forced(model: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> tuple[list[float], list[int]]:
    """Entropy and argmax of the distributions that chose each output token."""
    entropy: list[float] = []
    argmax: list[int] = []
    for logits in forced_logits(model, prompt_ids, output_ids):
        entropy += row_entropy(logits)
        argmax += logits.argmax(dim=-1).tolist()
    return entropy, argmax


def drafter_table(model: Any, prompt_ids: Sequence[int],
                  output_ids: Sequence[int]) -> tuple[list[tuple[int, ...]], list[tuple[float, ...]]]:
    """The small model's DRAFT_TOP likeliest tokens and their probabilities at each output position,
    on the verified context."""
    top: list[tuple[int, ...]] = []
    p: list[tuple[float, ...]] = []
    for logits in forced_logits(model, prompt_ids, output_ids):
        best = logits.float().softmax(dim=-1).topk(DRAFT_TOP)
        top += [tuple(row) for row in best.indices.tolist()]
        p += [tuple(round(x, 5) for x in row) for row in best.values.tolist()]
    return top, p


def record(config: GeneratorConfig, prompts: Sequence[Prompt], max_new_tokens: int, source: str,
           progress: bool = True) -> Recorded:
    """Each prompt's greedy continuation of up to max_new_tokens, with its entropies."""
    from tqdm import tqdm

    from specpipe.app.wiring import embedded_generator

    generator = embedded_generator(config, (config.speculation.drafter, "model"))
    model = generator.verifier.model  # type: ignore[attr-defined]  # embedded: the ModelVerifier, whose model it is
    drafter = generator.drafters["model"]
    entries, disagreements, tokens = [], 0, 0
    for prompt in tqdm(prompts, desc="recording greedy continuations", disable=not progress):
        prompt_ids = generator.encode(messages=prompt.messages)
        output: list[int] = []
        finish = ""
        for chunk in generator.generate(GenerationRequest(prompt_ids, max_new_tokens, speculation=generator.defaults)):
            output += chunk.token_ids
            finish = chunk.finish_reason or finish
        entropy, argmax = forced(model, prompt_ids, output)
        draft_top, draft_p = drafter_table(drafter.model, prompt_ids, output)  # type: ignore[attr-defined]
        disagreements += sum(a != t for a, t in zip(argmax, output))
        tokens += len(output)
        entries.append(Entry(tuple(prompt_ids), tuple(output), tuple(round(e, 5) if math.isfinite(e) else 0.0
                                                                     for e in entropy), finish, prompt.id,
                             tuple(draft_top), tuple(draft_p)))
    transcript = Transcript(generator.info, attention_weight(model.config), tuple(entries), source, drafter.info())
    return Recorded(transcript, disagreements, tokens)
