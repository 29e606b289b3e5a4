"""Load-test arithmetic (docs/design.md, "Deployment shapes and serving": load is measured like vllm bench
serve): the per-request records a Locust run writes, the users a load shape wants at a time, and the
table per user level (aggregate tokens/s, TTFT and inter-token latency percentiles, goodput under SLOs,
errors). Pure functions over plain numbers: no locust import here, since importing locust monkey-patches
the whole process for gevent."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from specpipe.core.errors import InvalidArgument
from specpipe.core.types import ROUND_PARTS, RoundStats

OK = "OK"  # a record's status when the stream ended normally; else the gRPC status name


@dataclass(frozen=True)
class RequestRecord:
    """One Generate call as the load generator saw it."""

    start_s: float                  # wall clock (time.time()) at the call
    end_s: float                    # at the stream's end or its error
    users: int                      # users running when the call started: the level it belongs to
    status: str                     # OK or a gRPC status name
    tokens: int                     # verified tokens received
    ttft_ms: float | None = None    # call -> first chunk; None when no chunk came
    itl_ms: tuple[float, ...] = ()  # [tokens - first chunk's] each later chunk's gap, split over its tokens
    prompt_id: str = ""
    rounds: int = 0                 # verify rounds (chunks with round statistics)
    plain_rounds: int = 0           # ... of them without a draft (plain decoding)
    drafted: int = 0                # draft tokens verified, all rounds
    accepted: int = 0               # ... of them accepted
    part_ms: dict = field(default_factory=dict)  # the orchestrator's time by round part, all rounds (round_parts)

    @property
    def e2e_ms(self) -> float:
        return (self.end_s - self.start_s) * 1e3

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first chunk (vLLM's TPOT); None with no later token."""
        return sum(self.itl_ms) / len(self.itl_ms) if self.itl_ms else None


@dataclass(frozen=True)
class Slo:
    ttft_ms: float = math.inf
    itl_ms: float = math.inf  # bound on a request's mean inter-token latency (TPOT)


@dataclass(frozen=True)
class LevelSummary:
    users: int
    requests: int
    errors: dict[str, int] = field(default_factory=dict)  # gRPC status name -> count
    tokens: int = 0                    # tokens that arrived while the level ran (summarize)
    seconds: float = 0.0               # how long the level ran (its first call to the next level's)
    tokens_per_s: float = 0.0          # aggregate: tokens / seconds
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    good: int = 0                      # OK requests within the SLOs
    goodput_rps: float = 0.0           # good requests / seconds (vLLM's request goodput)
    tokens_per_round: float | None = None  # of the OK requests: tokens a verify round emitted
    plain_share: float | None = None   # ... the share of their rounds that carried no draft
    acceptance: float | None = None    # ... draft tokens accepted / verified (None: none verified)
    time_split: dict = field(default_factory=dict)  # ... where the orchestrator's time went (time_split)


SPLIT = ("prefill", "forward", "wait", "other")  # time_split's parts


def round_parts(stats: RoundStats) -> dict[str, float]:
    """A round's RoundStats as RequestRecord.part_ms adds them up: ms by ROUND_PARTS, and forward
    (the verifier's forward, part of the call)."""
    return {part: getattr(stats, f"{part}_ms") for part in ROUND_PARTS} | {"forward": stats.verify_ms}


def time_split(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Shares of the orchestrator's time for records (SPLIT): the verifier's prefill and forwards,
    waiting for drafts, and the other parts (the verify call beyond the forward, draft control,
    emitting, recording, between rounds); empty without parts (a server that does not report them)."""
    total = sum(ms for r in records for part, ms in r.part_ms.items() if part != "forward")
    if not total:
        return {}
    shares = {part: sum(r.part_ms.get(part, 0.0) for r in records) / total for part in SPLIT[:3]}
    return shares | {"other": max(0.0, 1.0 - sum(shares.values()))}


def itl_per_token(gap_ms: float, tokens: int) -> list[float]:
    """A chunk of `tokens` tokens that came gap_ms after the previous one: each token's share."""
    return [gap_ms / tokens] * tokens if tokens > 0 else []


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, linear between closest ranks (numpy's default); None when empty."""
    if not 0 <= q <= 100:
        raise InvalidArgument(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    if not ordered:
        return None
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def within_slo(record: RequestRecord, slo: Slo) -> bool:
    if record.status != OK or record.ttft_ms is None or record.ttft_ms > slo.ttft_ms:
        return False
    tpot = record.tpot_ms
    return tpot is None or tpot <= slo.itl_ms


def parse_slo(text: str) -> Slo:
    """`ttft=MS,itl=MS` (either may be left out) -> Slo."""
    bounds: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in ("ttft", "itl") or not value:
            raise InvalidArgument(f"--slo takes ttft=MS,itl=MS, got {part!r}")
        try:
            bounds[f"{name}_ms"] = float(value)
        except ValueError:
            raise InvalidArgument(f"--slo {name}: not a number of milliseconds: {value!r}") from None
        if bounds[f"{name}_ms"] <= 0:
            raise InvalidArgument(f"--slo {name} must be positive, got {value}")
    return Slo(**bounds)


def summarize_level(users: int, records: Sequence[RequestRecord], slo: Slo) -> LevelSummary:
    ok = [r for r in records if r.status == OK]
    seconds = max(r.end_s for r in records) - min(r.start_s for r in records) if records else 0.0
    tokens = sum(r.tokens for r in records)
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    itls = [itl for r in ok for itl in r.itl_ms]
    good = sum(within_slo(r, slo) for r in records)
    rounds, drafted = sum(r.rounds for r in ok), sum(r.drafted for r in ok)
    return LevelSummary(
        users=users, requests=len(records),
        errors=dict(sorted(Counter(r.status for r in records if r.status != OK).items())),
        tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        ttft_p50_ms=percentile(ttfts, 50), ttft_p99_ms=percentile(ttfts, 99),
        itl_p50_ms=percentile(itls, 50), itl_p99_ms=percentile(itls, 99),
        e2e_p50_ms=percentile([r.e2e_ms for r in ok], 50),
        good=good, goodput_rps=good / seconds if seconds > 0 else 0.0,
        tokens_per_round=sum(r.tokens for r in ok) / rounds if rounds else None,
        plain_share=sum(r.plain_rounds for r in ok) / rounds if rounds else None,
        acceptance=sum(r.accepted for r in ok) / drafted if drafted else None,
        time_split=time_split(ok),
    )


def speculation_cell(level: LevelSummary) -> str:
    """Tokens a round, the plain rounds' share and the acceptance: "2.41 (38% plain, 52% accepted)"."""
    if level.tokens_per_round is None:
        return "-"
    accepted = "" if level.acceptance is None else f", {level.acceptance:.0%} accepted"
    return f"{level.tokens_per_round:.2f} ({level.plain_share:.0%} plain{accepted})"


def split_cell(level: LevelSummary) -> str:
    """The level's time_split: "6 / 81 / 3 / 10%"."""
    if not level.time_split:
        return "-"
    return " / ".join(f"{level.time_split[part]:.0%}".removesuffix("%") for part in SPLIT) + "%"


def token_times(record: RequestRecord) -> list[float]:
    """When each token of the record arrived (wall clock, seconds)."""
    if record.ttft_ms is None:
        return []
    t = record.start_s + record.ttft_ms / 1e3
    times = [t] * max(0, record.tokens - len(record.itl_ms))  # the first chunk's tokens
    for gap_ms in record.itl_ms:
        t += gap_ms / 1e3
        times.append(t)
    return times


def level_windows(records: Sequence[RequestRecord]) -> dict[int, tuple[float, float]]:
    """users -> (start, end) of the time that level ran: from its first call to the next level's
    first call (the last level: to the last end), levels taken in the order they started."""
    firsts: dict[int, float] = {}
    for r in records:
        firsts[r.users] = min(firsts.get(r.users, r.start_s), r.start_s)
    order = sorted(firsts, key=lambda users: firsts[users])
    ends = [firsts[u] for u in order[1:]] + [max((r.end_s for r in records), default=0.0)]
    return {u: (firsts[u], end) for u, end in zip(order, ends)}


def summarize(records: Iterable[RequestRecord], slo: Slo) -> list[LevelSummary]:
    """One summary per user level, fewest users first. A request's latencies and status belong to the
    level it started at; the aggregate tokens/s of a level counts every token that arrived while it
    ran, whichever level its request started at (a long request outlives its level)."""
    records = list(records)
    by_users: dict[int, list[RequestRecord]] = {}
    for record in records:
        by_users.setdefault(record.users, []).append(record)
    arrivals = [t for r in records for t in token_times(r)]
    levels, windows = [], level_windows(records)
    last = max(windows, key=lambda u: windows[u][0], default=None)
    for users, (start, end) in sorted(windows.items()):
        level = summarize_level(users, by_users[users], slo)
        seconds = end - start
        tokens = sum(start <= t < end or (users == last and t == end) for t in arrivals)
        if seconds > 0:
            level = replace(level, tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds,
                            goodput_rps=level.good / seconds)
        levels.append(level)
    return levels


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def markdown_table(levels: Sequence[LevelSummary], slo: Slo) -> str:
    bounds = ", ".join(f"{name} <= {value:g} ms" for name, value in (("TTFT", slo.ttft_ms), ("ITL", slo.itl_ms))
                       if math.isfinite(value)) or "none"
    rows = [("| users | requests | tokens/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | e2e p50 (ms) | "
             f"goodput (req/s; SLO {bounds}) | tokens a round (plain rounds, drafts accepted) | "
             "orchestrator's time: prefill / forwards / draft wait / other | errors |"),
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for s in levels:
        errors = ", ".join(f"{code} {count}" for code, count in s.errors.items()) or "0"
        rows.append(
            f"| {s.users} | {s.requests} | {s.tokens_per_s:.1f} | {_ms(s.ttft_p50_ms)} / {_ms(s.ttft_p99_ms)} | "
            f"{_ms(s.itl_p50_ms)} / {_ms(s.itl_p99_ms)} | {_ms(s.e2e_p50_ms)} | "
            f"{s.goodput_rps:.2f} ({s.good}/{s.requests}) | {speculation_cell(s)} | {split_cell(s)} | {errors} |"
        )
    return "\n".join(rows)


def to_json(levels: Sequence[LevelSummary], slo: Slo) -> dict:
    return {"slo": {k: (v if math.isfinite(v) else None) for k, v in asdict(slo).items()},
            "levels": [asdict(s) for s in levels]}


def record_line(record: RequestRecord) -> str:
    """A record as its JSON line (the --records file: one a call)."""
    return json.dumps(asdict(record)) + "\n"


def read_records(path: str | Path) -> list[RequestRecord]:
    records = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            records.append(RequestRecord(**{**data, "itl_ms": tuple(data.get("itl_ms", ()))}))
    return records


@dataclass(frozen=True)
class MemoryTrend:
    """Resident memory of one process over a run, after its warm-up."""

    first_mb: float     # median of the first third of the samples
    last_mb: float      # median of the last third
    peak_mb: float
    slope_mb_per_min: float  # least-squares line through all samples

    @property
    def growth_mb(self) -> float:
        return self.last_mb - self.first_mb


def memory_trend(samples: Sequence[tuple[float, float]], warmup_s: float = 0.0) -> MemoryTrend | None:
    """(seconds, resident MB) samples -> their trend from warmup_s on; None with fewer than 3 samples.
    Medians of thirds, not single samples, so one allocator burst does not read as a leak."""
    kept = sorted((t, mb) for t, mb in samples if t >= warmup_s)
    if len(kept) < 3:
        return None
    third = len(kept) // 3
    times, mbs = [t for t, _ in kept], [mb for _, mb in kept]
    mean_t, mean_mb = sum(times) / len(times), sum(mbs) / len(mbs)
    var_t = sum((t - mean_t) ** 2 for t in times)
    slope = sum((t - mean_t) * (mb - mean_mb) for t, mb in kept) / var_t if var_t > 0 else 0.0
    return MemoryTrend(first_mb=percentile(mbs[:third], 50) or 0.0, last_mb=percentile(mbs[-third:], 50) or 0.0,
                       peak_mb=max(mbs), slope_mb_per_min=slope * 60)
