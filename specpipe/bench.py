"""Benchmark harness: verifier-only greedy generate() against speculative decoding on the same
prompts, models and threads, in one run (shared/DESIGN.md section 10). Absolute times vary between
machines; the ratios from one run are what count. Every speculative output is checked against the
baseline output token for token."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch
from tqdm import tqdm

from specpipe.types import GenerationRequest, SpeculationOptions

BASELINE = "verifier-only generate()"


@dataclass(frozen=True)
class PromptRun:
    prompt_id: str
    prompt_tokens: int
    token_ids: tuple[int, ...]
    seconds: float
    rounds: int = 0       # verifier forward passes (speculative runs)
    drafted: int = 0
    accepted: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    predicted: int = 0     # rounds whose draft could come from a pre-draft (branch schedule)
    hits: int = 0
    hidden_ms: float = 0.0
    idle_ms: float = 0.0


@dataclass(frozen=True)
class MethodSummary:
    method: str
    tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float               # tokens/s over the baseline's
    tokens_per_round: float      # DE: tokens per verifier forward
    acceptance: float            # accepted / drafted
    identical: int               # prompts whose output equals the baseline's token for token
    prompts: int
    hit_rate: float = 0.0        # rounds whose outcome matched a hypothesis / rounds with hypotheses
    hidden_share: float = 0.0    # draft time hidden behind verification / draft time
    idle_share: float = 0.0      # verifier idle between rounds / wall time
    runs: list[PromptRun] = field(default_factory=list, repr=False)


def run_baseline(model, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int]) -> tuple[tuple[int, ...], float]:
    """transformers greedy generate() of the verifier alone; output cut after the first EOS."""
    ids = torch.tensor([list(prompt_ids)], device=model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    seconds = time.perf_counter() - start
    tokens = out[0, len(prompt_ids):].tolist()
    cut = next((i + 1 for i, t in enumerate(tokens) if t in eos_token_ids), len(tokens))
    return tuple(tokens[:cut]), seconds


def run_speculative(generator, prompt_id: str, prompt_ids: Sequence[int], max_new_tokens: int,
                    speculation: SpeculationOptions) -> PromptRun:
    request = GenerationRequest(tuple(prompt_ids), max_new_tokens, speculation=speculation)
    start = time.perf_counter()
    chunks = list(generator.generate(request))
    seconds = time.perf_counter() - start
    rounds = [c.round for c in chunks if c.round is not None]
    return PromptRun(
        prompt_id, len(prompt_ids), tuple(t for c in chunks for t in c.token_ids), seconds, len(rounds),
        sum(r.drafted for r in rounds), sum(r.accepted for r in rounds),
        sum(r.draft_ms for r in rounds), sum(r.verify_ms for r in rounds),
        sum(r.hypotheses > 0 for r in rounds), sum(r.hit for r in rounds),
        sum(r.hidden_ms for r in rounds), sum(r.idle_ms for r in rounds),
    )


def summarize(method: str, runs: list[PromptRun], baseline: list[PromptRun] | None) -> MethodSummary:
    tokens = sum(len(r.token_ids) for r in runs)
    seconds = sum(r.seconds for r in runs)
    tokens_per_s = tokens / seconds if seconds else 0.0
    rounds = sum(r.rounds for r in runs)
    drafted = sum(r.drafted for r in runs)
    if baseline is None:
        speedup, identical = 1.0, len(runs)
    else:
        base_tokens = sum(len(r.token_ids) for r in baseline)
        base_seconds = sum(r.seconds for r in baseline)
        speedup = tokens_per_s / (base_tokens / base_seconds) if base_seconds else 0.0
        identical = sum(r.token_ids == b.token_ids for r, b in zip(runs, baseline))
    predicted = sum(r.predicted for r in runs)
    draft_ms = sum(r.draft_ms for r in runs)
    return MethodSummary(
        method, tokens, seconds, tokens_per_s, speedup,
        tokens_per_round=tokens / rounds if rounds else 1.0,
        acceptance=sum(r.accepted for r in runs) / drafted if drafted else 0.0,
        identical=identical, prompts=len(runs),
        hit_rate=sum(r.hits for r in runs) / predicted if predicted else 0.0,
        hidden_share=sum(r.hidden_ms for r in runs) / draft_ms if draft_ms else 0.0,
        idle_share=sum(r.idle_ms for r in runs) / (seconds * 1e3) if seconds else 0.0,
        runs=runs,
    )


def benchmark(verifier_model, eos: Sequence[int], prompts, max_new_tokens: int,
              methods: dict[str, tuple[object, SpeculationOptions]], progress: bool = True) -> list[MethodSummary]:
    """prompts: [(prompt_id, prompt_ids)]; methods: name -> (generator, speculation options). Each
    prompt runs the baseline and then every method back to back, so a change in machine load during
    the run falls on every method alike."""
    runs: dict[str, list[PromptRun]] = {BASELINE: [], **{method: [] for method in methods}}
    for prompt_id, ids in tqdm(prompts, desc=f"{len(methods) + 1} methods per prompt", disable=not progress):
        tokens, seconds = run_baseline(verifier_model, ids, max_new_tokens, eos)
        runs[BASELINE].append(PromptRun(prompt_id, len(ids), tokens, seconds, rounds=len(tokens)))
        for method, (generator, speculation) in methods.items():
            runs[method].append(run_speculative(generator, prompt_id, ids, max_new_tokens, speculation))
    return [summarize(BASELINE, runs[BASELINE], None)] + [
        summarize(method, runs[method], runs[BASELINE]) for method in methods
    ]


def markdown_table(summaries: list[MethodSummary]) -> str:
    lines = [
        "| method | tokens/s | speed-up | tokens per verify (DE) | acceptance | hit rate | draft hidden "
        "| verifier idle | identical to baseline |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in summaries:
        branch = any(r.predicted for r in s.runs)
        lines.append(f"| {s.method} | {s.tokens_per_s:.2f} | {s.speedup:.2f}x | {s.tokens_per_round:.2f} | "
                     f"{s.acceptance:.0%} | {f'{s.hit_rate:.0%}' if branch else '-'} | "
                     f"{f'{s.hidden_share:.0%}' if branch else '-'} | {s.idle_share:.0%} | {s.identical}/{s.prompts} |")
    return "\n".join(lines)


def to_json(summaries: list[MethodSummary], meta: dict) -> dict:
    return {"meta": meta, "methods": [asdict(s) for s in summaries]}
