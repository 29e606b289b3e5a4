"""The golden reference: the verifier's own greedy `transformers` generate(), token for token."""

from __future__ import annotations

import itertools

import torch

GOLDEN_PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "import numpy as np\n\nx = np.",
    "Once upon a time, there was a",
    "SELECT name FROM users WHERE",
    "1, 2, 3, 4, 5,",
    "Q: What is 17 * 3?\nA:",
    "<html><body><h1>",
]


def reference_greedy(model, prompt_ids, max_new_tokens: int) -> list[int]:
    """Verifier-only greedy decoding, cut after the first EOS like a generation is."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([list(prompt_ids)], device=model.device), max_new_tokens=max_new_tokens,
                             do_sample=False, attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long,
                                                                        device=model.device))
    tokens = out[0, len(prompt_ids):].tolist()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def golden_references(tokenizer, verifier_model, max_new_tokens: int) -> dict:
    """prompt -> (prompt ids, reference output) for GOLDEN_PROMPTS."""
    out = {}
    for prompt in GOLDEN_PROMPTS:
        ids = tuple(tokenizer(prompt)["input_ids"])
        out[prompt] = (ids, reference_greedy(verifier_model, ids, max_new_tokens))
    return out


def run(generator, request) -> tuple[list[int], list]:
    token_ids, chunks = [], []
    for chunk in generator.generate(request):
        token_ids.extend(chunk.token_ids)
        chunks.append(chunk)
    return token_ids, chunks


_CALLS = itertools.count()


def assert_golden(generator, references: dict, max_new_tokens: int, speculation) -> tuple[int, int]:
    """Every prompt's speculative output equals its reference; returns (drafted, accepted) over all.
    Each call is a tenant of its own: what the store learns from one call's outputs (learning is on by
    default) does not turn the next call's prompts into exact repeats."""
    from specpipe.core.types import GenerationRequest

    drafted = accepted = 0
    tenant = f"golden-{next(_CALLS)}"
    for prompt, (ids, expected) in references.items():
        tokens, chunks = run(generator, GenerationRequest(ids, max_new_tokens, speculation=speculation, tenant=tenant))
        assert tokens == expected, prompt
        drafted += sum(c.round.drafted for c in chunks)
        accepted += sum(c.round.accepted for c in chunks)
    return drafted, accepted
