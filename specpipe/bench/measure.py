"""Benchmark harness: verifier-only greedy generate() against speculative decoding, and against
what users would pick instead (transformers assisted generation and prompt lookup), on the same
prompts, models and machine, in one run (docs/design.md, "Measuring on machines without a
GPU"). Absolute times vary between machines; the ratios from one run are what count. Every output is
checked token for token against the verifier alone run the same way."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from tqdm import tqdm

if TYPE_CHECKING:
    from orchestrator.generator import Generator

from specpipe.core.types import ALL_HYPOTHESES, GenerationRequest, RoundStats, SpeculationOptions
from specpipe.runtime import cpu

BASELINE = "verifier-only generate()"
# A specpipe run's wall time, split: the verifier's prefill, its forwards, drafting not hidden behind
# them, and orchestration (ORCHESTRATION: everything else, by where the orchestrator spent it).
ORCHESTRATION = ("verify_call", "draft_call", "control", "emit", "record", "rest")
TIME_PARTS = ("prefill", "forward", "draft", *ORCHESTRATION)


@dataclass(frozen=True)
class PromptRun:
    prompt_id: str
    prompt_tokens: int
    token_ids: tuple[int, ...]
    seconds: float
    rounds: int = 0       # verifier forward passes (0: not known, e.g. inside transformers generate())
    drafted: int = 0
    accepted: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    predicted: int = 0     # rounds whose draft could come from a pre-draft (branch schedule)
    hits: int = 0
    hidden_ms: float = 0.0
    idle_ms: float = 0.0
    round_drafted: tuple[int, ...] = ()   # [rounds] draft nodes of each round
    round_accepted: tuple[int, ...] = ()  # [rounds] accepted tokens of each round
    prefill_ms: float = 0.0  # the prompt's prefill: specpipe's verifier prefill; transformers': to its first tokens
    prefill_tokens: int = 0  # tokens that came with the prefill (transformers: its first forward's or round's)
    parts: dict = field(default_factory=dict)  # specpipe: ms by TIME_PARTS (time_parts)
    cpu_s: dict = field(default_factory=dict)  # specpipe: CPU s by "role/hop" in this process, and "process"

    @property
    def decode_seconds(self) -> float:
        return self.seconds - self.prefill_ms / 1e3

    @property
    def decode_tokens(self) -> int:
        return len(self.token_ids) - self.prefill_tokens


@dataclass(frozen=True)
class MethodSpec:
    """A specpipe bench method, every setting concrete (what a bench JSON records per method)."""

    drafter: str            # DRAFTER_KINDS; "none" = the verifier alone
    schedule: str
    predictor: str
    draft_len: int          # k; with adaptive control its cap
    width: int
    hypotheses: int         # M (branch schedule); ALL_HYPOTHESES = all
    adaptive: str           # "on" | "off"
    hop_delay_ms: float = 0.0
    compiled: bool = False
    learn_global: bool = False  # the method's n-gram store learns each finished output (drafts for later prompts)

    def speculation(self) -> SpeculationOptions:
        return SpeculationOptions(self.drafter, self.draft_len, self.width, self.schedule, self.predictor,
                                  self.hypotheses, self.adaptive)

    def name(self) -> str:
        if self.drafter == "none":
            return f"specpipe verifier alone{' compiled' if self.compiled else ''}"
        bound = "<=" if self.adaptive == "on" else "="
        name = (f"specpipe {self.drafter}{' adaptive' if self.adaptive == 'on' else ''} "
                f"k{bound}{self.draft_len} width={self.width} {self.schedule}")
        if self.schedule == "branch":
            m = "all" if self.hypotheses == ALL_HYPOTHESES else self.hypotheses
            name += f" {self.predictor} M{bound}{m}"
        return name + (f" hop {self.hop_delay_ms:g} ms" if self.hop_delay_ms else "") + (
            " learning" if self.learn_global else "")

    def setting(self) -> MethodSpec:
        """The method with its draft length and adaptive control left out (what a sweep varies)."""
        return replace(self, draft_len=0, adaptive="")


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
    reference: str = ""          # whose outputs `identical` compares with: the verifier alone, run the same way
    speedup_reference: float | None = None  # tokens/s over the reference's, where it is not the baseline
    hit_rate: float = 0.0        # rounds whose outcome matched a hypothesis / rounds with hypotheses
    hidden_share: float = 0.0    # draft time hidden behind verification / draft time
    idle_share: float = 0.0      # verifier idle between rounds / wall time
    acceptance_by_position: tuple[float, ...] = ()  # [k] P(draft token i accepted | the ones before were)
    # The wall time, split (shares of it): verifier forwards, draft time not hidden behind them, the
    # rest (prefill and orchestration: other_share = prefill_share + orchestration_share); orchestration
    # by its parts (ORCHESTRATION). Transformers baselines: prefill_share alone (to their first tokens).
    verify_share: float = 0.0
    draft_share: float = 0.0
    other_share: float = 0.0
    prefill_share: float = 0.0
    orchestration_share: float = 0.0
    orchestration: dict = field(default_factory=dict)
    cpu_us_per_token: dict = field(default_factory=dict)  # CPU by "role/hop" (and "process"), microseconds a token
    cpu_ms_per_round: float = 0.0  # the process's CPU time a round (its verifier's forwards included, in process)
    decode_tokens_per_s: float = 0.0  # tokens after the prefill per second after it
    # The speed-up over the reference that this run's measured acceptance by position and costs
    # allow at the best fixed draft length (speedup_bound), and the share of it reached.
    bound: float = 0.0
    bound_share: float = 0.0
    spec: MethodSpec | None = None  # a specpipe method's settings; None for a transformers baseline
    default: bool = False           # ran the product's default configuration for the run's models (report.headline)
    runs: list[PromptRun] = field(default_factory=list, repr=False)


MethodRun = Callable[[str, Sequence[int]], PromptRun]  # (prompt id, prompt ids) -> the run


class FirstTokens:
    """A transformers streamer that notes when generate() hands over its first new tokens (the first
    put after the prompt's) and how many: the end of its prefill."""

    def __init__(self):
        self.puts, self.at, self.tokens = 0, 0.0, 0

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.at, self.tokens = time.perf_counter(), int(value.numel())

    def end(self) -> None:
        pass


def transformers_method(model: Any, max_new_tokens: int, eos_token_ids: Sequence[int],
                        threads: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
                        plain: bool = True, **generate_kwargs: Any) -> MethodRun:
    """transformers greedy generate() of the verifier, with generate_kwargs (assistant_model=...:
    assisted generation; prompt_lookup_num_tokens=...: prompt lookup), under the threads context;
    output cut after the first EOS. plain: one forward per token, so rounds = tokens. The prefill is
    the time to the first new tokens (assisted and prompt lookup: their first round, which prefills)."""

    def run(prompt_id: str, prompt_ids: Sequence[int]) -> PromptRun:
        ids = torch.tensor([list(prompt_ids)], device=model.device)
        first = FirstTokens()
        with threads(), torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, streamer=first, **generate_kwargs)
            seconds = time.perf_counter() - start
        tokens = out[0, len(prompt_ids):].tolist()
        cut = next((i + 1 for i, t in enumerate(tokens) if t in eos_token_ids), len(tokens))
        prefill_ms = (first.at - start) * 1e3 if first.at else seconds * 1e3
        return PromptRun(prompt_id, len(prompt_ids), tuple(tokens[:cut]), seconds, rounds=cut if plain else 0,
                         prefill_ms=prefill_ms, prefill_tokens=min(cut, first.tokens or cut))

    return run


def specpipe_method(generator: Generator, max_new_tokens: int, speculation: SpeculationOptions) -> MethodRun:
    def run(prompt_id: str, prompt_ids: Sequence[int]) -> PromptRun:
        return run_speculative(generator, prompt_id, prompt_ids, max_new_tokens, speculation)

    return run


def run_speculative(generator: Generator, prompt_id: str, prompt_ids: Sequence[int], max_new_tokens: int,
                    speculation: SpeculationOptions) -> PromptRun:
    request = GenerationRequest(tuple(prompt_ids), max_new_tokens, speculation=speculation)
    cpu_before = cpu.snapshot()
    start = time.perf_counter()
    chunks = list(generator.generate(request))
    seconds = time.perf_counter() - start
    cpu_s = cpu.since(cpu_before)
    rounds = [c.round for c in chunks if c.round is not None]
    return PromptRun(
        prompt_id, len(prompt_ids), tuple(t for c in chunks for t in c.token_ids), seconds, len(rounds),
        sum(r.drafted for r in rounds), sum(r.accepted for r in rounds),
        sum(r.draft_ms for r in rounds), sum(r.verify_ms for r in rounds),
        sum(r.hypotheses > 0 for r in rounds), sum(r.hit for r in rounds),
        sum(r.hidden_ms for r in rounds), sum(r.idle_ms for r in rounds),
        tuple(r.drafted for r in rounds), tuple(r.accepted for r in rounds),
        prefill_ms=sum(r.prefill_ms for r in rounds), parts=time_parts(rounds, seconds * 1e3), cpu_s=cpu_s,
    )


def time_parts(rounds: Sequence[RoundStats], wall_ms: float) -> dict[str, float]:
    """A generation's wall time in ms by TIME_PARTS, from its rounds' RoundStats: drafting is the
    drafter's own time that the orchestrator waited for (a round's draft_ms less what the previous
    verification hid, at most its wait), the verify and draft calls' other time is orchestration, and
    rest is whatever the rounds did not account for (the orchestrator's rest between rounds, the
    generation's start and end)."""
    draft = sum(min(r.wait_ms, max(0.0, r.draft_ms - r.hidden_ms)) for r in rounds)
    parts = {
        "prefill": sum(r.prefill_ms for r in rounds),
        "forward": sum(r.verify_ms for r in rounds),
        "draft": draft,
        "verify_call": sum(max(0.0, r.call_ms - r.verify_ms) for r in rounds),
        "draft_call": sum(r.wait_ms for r in rounds) - draft,
        "control": sum(r.control_ms for r in rounds),
        "emit": sum(r.emit_ms for r in rounds),
        "record": sum(r.record_ms for r in rounds),
    }
    parts["rest"] = max(0.0, wall_ms - sum(parts.values()))
    return parts


def acceptance_by_position(runs: Sequence[PromptRun]) -> tuple[float, ...]:
    """a_i = P(draft token i accepted | draft token i was drafted and the ones before it accepted)."""
    rounds = [(d, a) for r in runs for d, a in zip(r.round_drafted, r.round_accepted)]
    longest = max((d for d, _ in rounds), default=0)
    rates = []
    for i in range(1, longest + 1):
        tried = sum(d >= i and a >= i - 1 for d, a in rounds)
        rates.append(sum(a >= i for _, a in rounds) / tried if tried else 0.0)
    return tuple(rates)


def speedup_bound(rates: Sequence[float], t_1: float, draft_ms: float, verify_ms: float | Callable[[int], float],
                  overlapped: bool) -> float:
    """The best speed-up over a verifier alone taking t_1 ms per token, for draft lengths k <= len(rates):
    E(k) * t_1 / cost(k), where E(k) = 1 + sum over i <= k of a_1 ... a_i is the expected tokens per
    round from the per-position acceptance rates (Leviathan et al. 2023, with the measured rate of
    each position instead of one alpha), draft_ms the cost of one draft token and verify_ms of one
    verification (a number, or k -> the verification of k drafts, from a measured T(k + 1));
    cost(k) = k * draft_ms + verify_ms (sequential), or max(k * draft_ms, verify_ms) when drafting
    overlaps verification (the branch schedule with every prediction right)."""
    return best_draft_len(rates, t_1, draft_ms, verify_ms, overlapped)[0]


def best_draft_len(rates: Sequence[float], t_1: float, draft_ms: float, verify_ms: float | Callable[[int], float],
                   overlapped: bool) -> tuple[float, int]:
    """speedup_bound's (bound, the draft length k that reaches it)."""
    from orchestrator.costs import expected_tokens  # the E(k) adaptive control maximises

    best = (0.0, 0)
    for k in range(len(rates) + 1):
        verify = verify_ms(k) if callable(verify_ms) else verify_ms
        cost = max(k * draft_ms, verify) if overlapped else k * draft_ms + verify
        best = max(best, (expected_tokens(rates, k) * t_1 / cost if cost else 0.0, k))
    return best


def verify_cost(runs: Sequence[PromptRun], reference_runs: Sequence[PromptRun]) -> Callable[[int], float]:
    """k -> ms of one verification of k drafts: the line through the reference's (the verifier alone's)
    forward of one token and runs' mean verification at their mean draft size. A verification of more
    tokens costs more (T(k + 1) grows with k), so a bound that verified 32 drafts at the mean cost of
    this run's verifications of 4 would credit them for free. A reference without forwards of its own
    (transformers' generate()) leaves the mean cost for every k."""
    rounds, drafted = sum(r.rounds for r in runs), sum(r.drafted for r in runs)
    mean = sum(r.verify_ms for r in runs) / rounds
    alone_rounds = sum(r.rounds for r in reference_runs if r.verify_ms)
    if not alone_rounds or not drafted:
        return lambda k: mean
    alone = sum(r.verify_ms for r in reference_runs) / alone_rounds
    per_draft = max(0.0, (mean - alone) / (drafted / rounds))
    return lambda k: alone + per_draft * k


def decode_bound(runs: Sequence[PromptRun], reference_runs: Sequence[PromptRun]) -> tuple[float, float]:
    """(bound, share of it reached): speedup_bound over the reference (the verifier alone) from runs'
    acceptance by position, draft cost per token and verify_cost, with t_1 the reference's milliseconds
    per token decoded; the share compares decode tokens/s. (0, 0) for runs without drafts."""
    rounds, drafted = sum(r.rounds for r in runs), sum(r.drafted for r in runs)
    if not rounds or not drafted or not reference_runs:
        return 0.0, 0.0
    bound = speedup_bound(acceptance_by_position(runs), 1e3 / decode_throughput(reference_runs),
                          sum(r.draft_ms for r in runs) / drafted, verify_cost(runs, reference_runs),
                          overlapped=any(r.predicted for r in runs))
    return bound, decode_throughput(runs) / decode_throughput(reference_runs) / bound if bound else 0.0


def per_prompt_speedups(runs: Sequence[PromptRun], others: Sequence[PromptRun]) -> list[float]:
    """Each prompt's tokens/s over the same prompt's in others."""
    return [(len(r.token_ids) / r.seconds) / (len(o.token_ids) / o.seconds)
            for r, o in zip(runs, others) if r.seconds and o.seconds and o.token_ids]


def summarize(method: str, runs: list[PromptRun], baseline: tuple[str, list[PromptRun]] | None,
              reference: tuple[str, list[PromptRun]] | None = None) -> MethodSummary:
    """baseline: (name, runs) that speed-up is over (None: this is the baseline); reference: (name,
    runs) of the verifier alone run the same way as this method, the lossless check's yardstick
    (None: the baseline)."""
    tokens = sum(len(r.token_ids) for r in runs)
    seconds = sum(r.seconds for r in runs)
    tokens_per_s = throughput(runs)
    rounds = sum(r.rounds for r in runs)
    drafted = sum(r.drafted for r in runs)
    speedup = tokens_per_s / throughput(baseline[1]) if baseline else 1.0
    reference_name, reference_runs = reference or baseline or (method, runs)
    identical = sum(r.token_ids == b.token_ids for r, b in zip(runs, reference_runs))
    speedup_reference = tokens_per_s / throughput(reference_runs) if reference else None
    predicted = sum(r.predicted for r in runs)
    draft_ms = sum(r.draft_ms for r in runs)
    verify_ms = sum(r.verify_ms for r in runs)
    exposed_ms = draft_ms - sum(r.hidden_ms for r in runs)
    wall_ms = seconds * 1e3
    rates = acceptance_by_position(runs)
    bound, bound_share = decode_bound(runs, reference_runs)
    prefill_ms = sum(r.prefill_ms for r in runs)
    parts = {part: sum(r.parts.get(part, 0.0) for r in runs) / wall_ms for part in TIME_PARTS} if seconds else {}
    split = seconds and all(r.parts for r in runs)  # runs of the orchestrator's time parts
    draft_share = (parts["draft"] if split else exposed_ms / wall_ms) if seconds else 0.0
    return MethodSummary(
        method, tokens, seconds, tokens_per_s, speedup,
        tokens_per_round=tokens / rounds if rounds else 0.0,
        acceptance=sum(r.accepted for r in runs) / drafted if drafted else 0.0,
        identical=identical, prompts=len(runs), reference=reference_name, speedup_reference=speedup_reference,
        hit_rate=sum(r.hits for r in runs) / predicted if predicted else 0.0,
        hidden_share=sum(r.hidden_ms for r in runs) / draft_ms if draft_ms else 0.0,
        idle_share=sum(r.idle_ms for r in runs) / wall_ms if seconds else 0.0,
        acceptance_by_position=rates,
        verify_share=verify_ms / wall_ms if seconds else 0.0,
        draft_share=draft_share,
        other_share=max(0.0, 1.0 - verify_ms / wall_ms - draft_share) if seconds and rounds else 0.0,
        prefill_share=prefill_ms / wall_ms if seconds else 0.0,
        orchestration_share=sum(parts[p] for p in ORCHESTRATION) if split else 0.0,
        orchestration={p: parts[p] for p in ORCHESTRATION} if split else {},
        cpu_us_per_token=cpu_per_token(runs),
        cpu_ms_per_round=sum(r.cpu_s.get("process", 0.0) for r in runs) * 1e3 / rounds if rounds else 0.0,
        decode_tokens_per_s=decode_throughput(runs),
        bound=bound,
        bound_share=bound_share,
        runs=runs,
    )


def cpu_per_token(runs: Sequence[PromptRun]) -> dict[str, float]:
    """Microseconds of CPU a generated token, by "role/hop" and for the whole process, over runs."""
    tokens = sum(len(r.token_ids) for r in runs)
    names = sorted({name for r in runs for name in r.cpu_s})
    return {name: sum(r.cpu_s.get(name, 0.0) for r in runs) * 1e6 / tokens for name in names} if tokens else {}


def throughput(runs: list[PromptRun]) -> float:
    seconds = sum(r.seconds for r in runs)
    return sum(len(r.token_ids) for r in runs) / seconds if seconds else 0.0


def decode_throughput(runs: Sequence[PromptRun]) -> float:
    """Tokens per second after the prefill: the tokens after those that came with it, over the time after it."""
    seconds = sum(r.decode_seconds for r in runs)
    return sum(r.decode_tokens for r in runs) / seconds if seconds > 0 else 0.0


def benchmark(prompts: Sequence[tuple[str, Sequence[int]]], methods: dict[str, MethodRun],
              references: dict[str, str] | None = None,
              progress: bool = True) -> list[MethodSummary]:
    """prompts: [(prompt_id, prompt_ids)]; methods: name -> run, the first being the baseline that
    speed-ups are over; references: method -> the method whose outputs it must equal (the verifier
    alone run the same way; default the baseline). Each prompt runs every method back to back, so a
    change in machine load during the run falls on every method alike."""
    references = references or {}
    baseline = next(iter(methods))
    runs: dict[str, list[PromptRun]] = {method: [] for method in methods}
    for prompt_id, ids in tqdm(prompts, desc=f"{len(methods)} methods per prompt", disable=not progress):
        for method, run in methods.items():
            runs[method].append(run(prompt_id, ids))
    return [summarize(baseline, runs[baseline], None)] + [
        summarize(method, runs[method], (baseline, runs[baseline]),
                  (references[method], runs[references[method]]) if method in references else None)
        for method in list(methods)[1:]
    ]
