"""The pipeline's own cost under load (docs/pipeline.md): from samples of every service's Prometheus
counters and every process's CPU time taken through a load run, per user level: the CPU time of each
hop per round and per generated token (specpipe.runtime.cpu's `specpipe_cpu_seconds_total`, and each
process's whole CPU time, whose rest no hop names: gRPC's core, message (de)serialization around the
handlers, the garbage collector), the load generator's CPU, and the verifier's busy share (its
forwards' wall time over the level's). Pure functions over the samples; the sampler is
specpipe.bench.loadruns.CostSampler."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

CPU_COUNTER = "specpipe_cpu_seconds_total"
# The verifier's histograms whose mean over a level says why its forwards are not full: how long a session
# takes to come back after its round's forward (the orchestrator's turn), and how long work waits for one.
MEANS = {"specpipe_verify_turnaround_ms": "a session's turnaround (ms)",
         "specpipe_queue_wait_ms": "queue wait (ms)"}
Key = tuple[str, tuple[tuple[str, str], ...]]  # metric sample name, its labels sorted


@dataclass(frozen=True)
class Sample:
    """Every process's counters at one moment (time.time())."""

    t: float
    counters: Mapping[str, Mapping[Key, float]]  # service -> counter samples (the specpipe_* ones)
    process_cpu_s: Mapping[str, float]           # process (services, and "load generator") -> CPU s so far


@dataclass(frozen=True)
class LevelCost:
    users: int
    seconds: float
    tokens: float                  # emitted by the orchestrators in the window
    rounds: float                  # verify rounds the orchestrators ran
    forwards: float                # the verifiers' forwards
    busy_share: float | None       # the verifiers' forward time over the window (a mean over replicas)
    hop_cpu_s: dict = field(default_factory=dict)      # "service/role/hop" -> CPU s in the window
    process_cpu_s: dict = field(default_factory=dict)  # process -> CPU s in the window
    overruns: float = 0.0          # simulated forwards whose real compute overran the curve
    means: dict = field(default_factory=dict)  # the verifier's MEANS over the window (name -> ms)

    def per_token_us(self, seconds: float) -> float | None:
        return seconds / self.tokens * 1e6 if self.tokens else None

    @property
    def cores_busy(self) -> float:
        """CPU seconds per second of every process together: how many cores the run kept busy."""
        return sum(self.process_cpu_s.values()) / self.seconds if self.seconds else 0.0


def parse_counters(text: str) -> dict[Key, float]:
    """The specpipe_* counters and process_cpu_seconds_total of a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type == "histogram" and family.name in MEANS:  # its sum and count: a mean over a window
            for s in family.samples:
                if s.name.endswith(("_sum", "_count")):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        if family.type != "counter" and family.name != "process_cpu_seconds":
            continue
        for s in family.samples:
            if s.name.endswith("_total") or s.name == "process_cpu_seconds_total":
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def at(samples: Sequence[Sample], t: float, value: Callable[[Sample], float]) -> float:
    """value(sample) at time t, linear between the samples around it (clamped to the first and last)."""
    times = [s.t for s in samples]
    i = bisect.bisect_left(times, t)
    if i <= 0:
        return value(samples[0])
    if i >= len(samples):
        return value(samples[-1])
    a, b = samples[i - 1], samples[i]
    share = (t - a.t) / (b.t - a.t) if b.t > a.t else 1.0
    return value(a) + share * (value(b) - value(a))


def total(counters: Mapping[Key, float], name: str, **labels: str) -> float:
    """The sum of a counter's samples whose labels include labels."""
    return sum(v for (n, ls), v in counters.items()
               if n == name and all(dict(ls).get(k) == x for k, x in labels.items()))


def _delta(samples: Sequence[Sample], start: float, end: float, value: Callable[[Sample], float]) -> float:
    return max(0.0, at(samples, end, value) - at(samples, start, value))


def _total_of(service: str, name: str, labels: Mapping[str, str]) -> Callable[[Sample], float]:
    return lambda s: total(s.counters.get(service, {}), name, **labels)


def _sample_of(service: str, key: Key) -> Callable[[Sample], float]:
    return lambda s: s.counters.get(service, {}).get(key, 0.0)


def _cpu_of(process: str) -> Callable[[Sample], float]:
    return lambda s: s.process_cpu_s.get(process, 0.0)


def level_cost(samples: Sequence[Sample], users: int, start: float, end: float) -> LevelCost:
    """What the window [start, end] cost, from the samples around it."""
    services = sorted({name for s in samples for name in s.counters})

    def summed(name: str, role_prefix: str = "", **labels: str) -> float:
        return sum(_delta(samples, start, end, _total_of(svc, name, labels))
                   for svc in services if svc.startswith(role_prefix))

    hops: dict[str, float] = {}
    for svc in services:
        keys = {ls for s in samples for (n, ls) in s.counters.get(svc, {}) if n == CPU_COUNTER}
        for ls in sorted(keys):
            labels = dict(ls)
            spent = _delta(samples, start, end, _sample_of(svc, (CPU_COUNTER, ls)))
            hops[f"{svc}/{labels.get('role')}/{labels.get('hop')}"] = spent
    processes = sorted({p for s in samples for p in s.process_cpu_s})
    process_cpu = {p: _delta(samples, start, end, _cpu_of(p)) for p in processes}
    seconds = end - start
    verifiers = [svc for svc in services if svc.startswith("verifier")]
    forward_s = summed("specpipe_forward_seconds_total", "verifier", role="verifier")
    busy = forward_s / seconds / len(verifiers) if verifiers and seconds > 0 else None
    means = {}
    for name in MEANS:
        labels = {"role": "verifier"} if name == "specpipe_queue_wait_ms" else {}
        count = summed(f"{name}_count", "verifier", **labels)
        if count:
            means[name] = summed(f"{name}_sum", "verifier", **labels) / count
    return LevelCost(users, seconds, summed("specpipe_emitted_tokens_total", "orchestrator"),
                     summed("specpipe_rounds_total", "orchestrator"),
                     summed("specpipe_forwards_total", "verifier", role="verifier"), busy, hops, process_cpu,
                     summed("specpipe_simulated_overruns_total", "verifier"), means)


def level_costs(samples: Sequence[Sample], windows: Mapping[int, tuple[float, float]]) -> list[LevelCost]:
    """One LevelCost per user level (specpipe.bench.loadstats.level_windows), fewest users first."""
    if len(samples) < 2:
        return []
    return [level_cost(samples, users, start, end) for users, (start, end) in sorted(windows.items())]


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def markdown_table(costs: Sequence[LevelCost], clock: str = "") -> str:
    """Rows: each hop and process, in microseconds of CPU per generated token, then the totals; a column a level."""
    if not costs:
        return ""
    head = "| process / role / hop | " + " | ".join(f"{c.users} users" for c in costs) + " |"
    rows = [head, "| --- |" + " ---: |" * len(costs)]
    hops = sorted({h for c in costs for h in c.hop_cpu_s})
    processes = sorted({p for c in costs for p in c.process_cpu_s})
    for process in processes:
        own = [h for h in hops if h.startswith(f"{process}/")]
        for hop in own:
            cells = " | ".join(_us(c.per_token_us(c.hop_cpu_s.get(hop, 0.0))) for c in costs)
            rows.append(f"| {hop} | {cells} |")
        if own:  # what no hop of the process names
            rest = [c.process_cpu_s.get(process, 0.0) - sum(c.hop_cpu_s.get(h, 0.0) for h in own) for c in costs]
            rows.append(f"| {process}/other (gRPC core, (de)serialization, GC) | "
                        + " | ".join(_us(c.per_token_us(max(0.0, r))) for c, r in zip(costs, rest)) + " |")
        rows.append(f"| **{process} process** | " + " | ".join(
            _us(c.per_token_us(c.process_cpu_s.get(process, 0.0))) for c in costs) + " |")
    rows.append("| **all processes** | " + " | ".join(_us(c.per_token_us(sum(c.process_cpu_s.values())))
                                                    for c in costs) + " |")
    rows.append("| cores busy (CPU s per s) | " + " | ".join(f"{c.cores_busy:.2f}" for c in costs) + " |")
    rows.append("| tokens/s (orchestrators' count) | " + " | ".join(
        f"{c.tokens / c.seconds:.0f}" if c.seconds else "-" for c in costs) + " |")
    rows.append("| verifier busy share | " + " | ".join(
        "-" if c.busy_share is None else f"{100 * c.busy_share:.0f}%" for c in costs) + " |")
    rows.append("| tokens per verifier forward | " + " | ".join(
        f"{c.tokens / c.forwards:.1f}" if c.forwards else "-" for c in costs) + " |")
    for name, label in MEANS.items():
        if any(name in c.means for c in costs):
            rows.append(f"| verifier: {label} | " + " | ".join(
                f"{c.means[name]:.1f}" if name in c.means else "-" for c in costs) + " |")
    rows.append("| CPU ms per round, all processes | " + " | ".join(
        f"{1e3 * sum(c.process_cpu_s.values()) / c.rounds:.2f}" if c.rounds else "-" for c in costs) + " |")
    if any(c.overruns for c in costs):
        rows.append("| forwards slower than the cost model | " + " | ".join(f"{c.overruns:.0f}" for c in costs) + " |")
    title = "where the CPU goes: microseconds of CPU per generated token"
    title += f"; forwards on the {clock}" if clock else ""
    return f"{title}\n" + "\n".join(rows)


def to_json(costs: Sequence[LevelCost]) -> list[dict]:
    return [{"users": c.users, "seconds": c.seconds, "tokens": c.tokens, "rounds": c.rounds, "forwards": c.forwards,
             "busy_share": c.busy_share, "cores_busy": c.cores_busy, "overruns": c.overruns, "means": c.means,
             "hop_cpu_s": c.hop_cpu_s, "process_cpu_s": c.process_cpu_s} for c in costs]
