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
    identical: int               # prompts whose output equals the reference's token for token
    prompts: int
    reference: str = BASELINE    # whose outputs `identical` compares with: the verifier alone, run the same way
    speedup_reference: float | None = None  # tokens/s over the reference's, where it is not the baseline
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


def summarize(method: str, runs: list[PromptRun], baseline: list[PromptRun] | None,
              reference: tuple[str, list[PromptRun]] | None = None) -> MethodSummary:
    """baseline: the runs speed-up is over (None: this is the baseline); reference: (name, runs) of
    the verifier alone run the same way as this method, the lossless check's yardstick (None: the
    baseline)."""
    tokens = sum(len(r.token_ids) for r in runs)
    seconds = sum(r.seconds for r in runs)
    tokens_per_s = throughput(runs)
    rounds = sum(r.rounds for r in runs)
    drafted = sum(r.drafted for r in runs)
    speedup = tokens_per_s / throughput(baseline) if baseline else 1.0
    reference_name, reference_runs = reference or (BASELINE, baseline or runs)
    identical = sum(r.token_ids == b.token_ids for r, b in zip(runs, reference_runs))
    speedup_reference = tokens_per_s / throughput(reference_runs) if reference else None
    predicted = sum(r.predicted for r in runs)
    draft_ms = sum(r.draft_ms for r in runs)
    return MethodSummary(
        method, tokens, seconds, tokens_per_s, speedup,
        tokens_per_round=tokens / rounds if rounds else 1.0,
        acceptance=sum(r.accepted for r in runs) / drafted if drafted else 0.0,
        identical=identical, prompts=len(runs), reference=reference_name, speedup_reference=speedup_reference,
        hit_rate=sum(r.hits for r in runs) / predicted if predicted else 0.0,
        hidden_share=sum(r.hidden_ms for r in runs) / draft_ms if draft_ms else 0.0,
        idle_share=sum(r.idle_ms for r in runs) / (seconds * 1e3) if seconds else 0.0,
        runs=runs,
    )


def throughput(runs: list[PromptRun]) -> float:
    seconds = sum(r.seconds for r in runs)
    return sum(len(r.token_ids) for r in runs) / seconds if seconds else 0.0


def benchmark(verifier_model, eos: Sequence[int], prompts, max_new_tokens: int,
              methods: dict[str, tuple[object, SpeculationOptions]], reference: str | None = None,
              progress: bool = True) -> list[MethodSummary]:
    """prompts: [(prompt_id, prompt_ids)]; methods: name -> (generator, speculation options);
    reference: the method whose outputs the others must equal (the compiled verifier alone), None
    for the baseline. Each prompt runs the baseline and then every method back to back, so a change
    in machine load during the run falls on every method alike."""
    runs: dict[str, list[PromptRun]] = {BASELINE: [], **{method: [] for method in methods}}
    for prompt_id, ids in tqdm(prompts, desc=f"{len(methods) + 1} methods per prompt", disable=not progress):
        tokens, seconds = run_baseline(verifier_model, ids, max_new_tokens, eos)
        runs[BASELINE].append(PromptRun(prompt_id, len(ids), tokens, seconds, rounds=len(tokens)))
        for method, (generator, speculation) in methods.items():
            runs[method].append(run_speculative(generator, prompt_id, ids, max_new_tokens, speculation))
    return [summarize(BASELINE, runs[BASELINE], None)] + [
        summarize(method, runs[method], runs[BASELINE],
                  (reference, runs[reference]) if reference and method != reference else None)
        for method in methods
    ]


def markdown_table(summaries: list[MethodSummary]) -> str:
    compiled = next((s.reference for s in summaries if s.speedup_reference is not None), None)
    extra = f" speed-up over {compiled} |" if compiled else ""
    lines = [
        "| method | tokens/s | speed-up |" + extra + " tokens per verify (DE) | acceptance | hit rate | draft hidden "
        "| verifier idle | identical to |",
        "| --- | ---: | ---: |" + (" ---: |" if compiled else "") + " ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for s in summaries:
        branch = any(r.predicted for r in s.runs)
        over = (f" {s.speedup_reference:.2f}x |" if s.speedup_reference is not None else " - |") if compiled else ""
        lines.append(f"| {s.method} | {s.tokens_per_s:.2f} | {s.speedup:.2f}x |{over} {s.tokens_per_round:.2f} | "
                     f"{s.acceptance:.0%} | {f'{s.hit_rate:.0%}' if branch else '-'} | "
                     f"{f'{s.hidden_share:.0%}' if branch else '-'} | {s.idle_share:.0%} | "
                     f"{s.reference}: {s.identical}/{s.prompts} |")
    return "\n".join(lines)


def to_json(summaries: list[MethodSummary], meta: dict) -> dict:
    return {"meta": meta, "methods": [asdict(s) for s in summaries]}
