"""A forward at another device's speed, for load tests (docs/pipeline.md, "The simulated clock").

On a GPU the verifier's forward takes milliseconds and is nearly flat in the tokens it feeds, so every
CPU-side cost of a round decides whether the expensive device waits. A ForwardCurve is a recorded
device's forward time by shape: the graphs mode's captured batches of whole steps (sessions x tokens
per session, `specpipe.engine.batched.BatchGraphs`) and its prompt chunks (one session's forward of
n tokens). ClockedForward runs the real forward (every token computed, or a transcript's answer:
verifier_service/replay.py) and then waits out the rest of the time the curve gives for the same
shapes, so the rest of the pipeline runs against the device's clock. It never hides a cost: a
forward whose real compute takes longer than the curve allows keeps its real time, and is counted
(`specpipe_simulated_overruns_total`) and logged.

The shapes follow BatchGraphs: whole steps of up to TOKEN_BUCKETS[-1] tokens go as one padded batch
(the smallest recorded (sessions, tokens) that holds them, in groups of the largest sessions
bucket); a prompt chunk (a segment without logits) or a longer step is a forward of its own
(specpipe.engine.batched.is_chunk). Between and beyond the
recorded points: a batch pads up to the next recorded bucket; past the largest recorded tokens, time
grows linearly with the slope of the last two recorded points (at least 0); a chunk past the largest
recorded one grows with the slope over the whole recorded chunk range.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specpipe.core.errors import InvalidArgument
from specpipe.engine.batched import TOKEN_BUCKETS
from specpipe.runtime import metrics

log = logging.getLogger(__name__)

CURVES = Path(__file__).with_name("curves")  # packaged curves, by name (--cost-model NAME)
OVERRUN_LOGS = 5  # overruns logged one by one; after that only counted


@dataclass(frozen=True)
class ForwardCurve:
    """A device's forward time (ms) by shape, for one role's model."""

    source: str                                  # the record it comes from: printed beside every simulated figure
    device: str                                  # e.g. "NVIDIA H200"
    role: str                                    # verifier or drafter
    steps_ms: Mapping[tuple[int, int], float]    # (sessions, tokens each) -> a padded batch of whole steps
    chunk_ms: Mapping[int, float]                # tokens -> one session's prompt chunk
    scale: float = 1.0                           # every time multiplied by this (a slower device); 1: as recorded
    sessions: tuple[int, ...] = field(init=False)
    tokens: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not self.steps_ms or not self.chunk_ms:
            raise InvalidArgument(f"cost model {self.source}: needs batched step times and chunk times for {self.role}")
        if self.scale <= 0:
            raise InvalidArgument(f"cost model scale must be > 0, got {self.scale}")
        object.__setattr__(self, "sessions", tuple(sorted({b for b, _ in self.steps_ms})))
        object.__setattr__(self, "tokens", tuple(sorted({n for _, n in self.steps_ms})))

    @property
    def group(self) -> int:
        """Sessions of whole steps a forward runs at once (the largest recorded batch); a larger batch
        runs as groups of this many, one after another (forward_ms)."""
        return self.sessions[-1]

    @property
    def label(self) -> str:
        """How a simulated figure names its clock."""
        scaled = "" if self.scale == 1 else f" x{self.scale:g}"
        return f"simulated {self.device}{scaled} ({self.source})"


def _extrapolated(points: Mapping[int, float], x: int) -> float:
    """The time at x from recorded (x, ms) points: the next recorded point up; past the last, linear
    with the slope of the last two (at least 0)."""
    xs = sorted(points)
    for known in xs:
        if x <= known:
            return points[known]
    if len(xs) == 1:
        return points[xs[-1]]
    slope = max(0.0, (points[xs[-1]] - points[xs[-2]]) / (xs[-1] - xs[-2]))
    return points[xs[-1]] + slope * (x - xs[-1])


def batch_ms(curve: ForwardCurve, sessions: int, tokens: int) -> float:
    """One padded batch of whole steps: the smallest recorded sessions bucket that holds `sessions`
    (at most the largest), `tokens` per session."""
    bucket = next((b for b in curve.sessions if b >= sessions), curve.sessions[-1])
    row = {n: ms for (b, n), ms in curve.steps_ms.items() if b == bucket}
    return _extrapolated(row, tokens)


def chunk_ms(curve: ForwardCurve, tokens: int) -> float:
    """One session's prompt chunk of `tokens`; past the largest recorded chunk, the slope over the
    whole recorded range."""
    xs = sorted(curve.chunk_ms)
    if tokens <= xs[-1]:
        return _extrapolated(curve.chunk_ms, tokens)
    slope = max(0.0, (curve.chunk_ms[xs[-1]] - curve.chunk_ms[xs[0]]) / max(1, xs[-1] - xs[0]))
    return curve.chunk_ms[xs[-1]] + slope * (tokens - xs[-1])


def forward_ms(curve: ForwardCurve, step_tokens: Sequence[int], chunk_tokens: Sequence[int] = ()) -> float:
    """The curve's time for a forward feeding these tokens per session: whole steps of at most
    TOKEN_BUCKETS[-1] tokens as padded batches (groups of the largest sessions bucket), each longer
    one and each prompt chunk (chunk_tokens) a forward of its own."""
    steps = [n for n in step_tokens if n <= TOKEN_BUCKETS[-1]]
    chunks = [n for n in step_tokens if n > TOKEN_BUCKETS[-1]] + list(chunk_tokens)
    if not steps and not chunks:
        return 0.0
    group = curve.group
    ms = sum(batch_ms(curve, len(g), max(g)) for g in (steps[i:i + group] for i in range(0, len(steps), group)))
    ms += sum(chunk_ms(curve, n) for n in chunks)
    return ms * curve.scale


# --- files ----------------------------------------------------------------------------------------

def _shape(key: str) -> tuple[int, int]:
    sessions, _, tokens = key.partition("x")
    return int(sessions), int(tokens)


def from_record(record: Mapping, role: str, source: str, scale: float = 1.0) -> ForwardCurve:
    """A curve from a GPU record (scripts/gpu_check.py's JSON: cost.<role>.batched_graphs_ms
    "BxN" -> ms, and graphs_ms, one session's forward of k tokens, for the chunks) or from a curve
    file (steps_ms, chunk_ms per role)."""
    if "cost" in record:  # a gpu_check record
        cost = record["cost"].get(role)
        if not isinstance(cost, Mapping) or "batched_graphs_ms" not in cost:
            raise InvalidArgument(f"cost model {source}: the record has no batched graphs times for the {role}")
        device = record.get("environment", {}).get("gpu", "GPU")
        steps, chunks = cost["batched_graphs_ms"], cost.get("graphs_ms") or {"1": cost["batched_graphs_ms"]["1x1"]}
    else:
        entry = record.get(role)
        if not isinstance(entry, Mapping):
            raise InvalidArgument(f"cost model {source}: no curve for the {role} (has {', '.join(record)})")
        device, steps, chunks = record.get("device", "device"), entry["steps_ms"], entry["chunk_ms"]
        source = record.get("source", source)
    try:
        return ForwardCurve(source, device, role, {_shape(k): float(v) for k, v in steps.items()},
                            {int(k): float(v) for k, v in chunks.items()}, scale)
    except (ValueError, TypeError, AttributeError) as err:
        raise InvalidArgument(f"cost model {source}: unreadable curve for the {role}: {err}") from None


def resolve(name: str) -> Path:
    """A curve file: a path, or the name of a packaged curve (specpipe/engine/curves/NAME.json)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    packaged = CURVES / f"{name}.json"
    if packaged.is_file():
        return packaged
    known = ", ".join(sorted(p.stem for p in CURVES.glob("*.json")))
    raise InvalidArgument(f"cost model {name!r}: no such file, and not a packaged curve ({known})")


def load_curve(spec: str, role: str) -> ForwardCurve:
    """--cost-model FILE_OR_NAME[:xSCALE] for one role (xSCALE: every time times SCALE, a slower device)."""
    name, _, scale = spec.rpartition(":x") if ":x" in spec else (spec, "", "")
    try:
        factor = float(scale) if scale else 1.0
    except ValueError:
        raise InvalidArgument(f"cost model {spec!r}: the scale after ':x' must be a number") from None
    path = resolve(name)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InvalidArgument(f"cost model {path}: not a readable JSON file: {err}") from None
    return from_record(record, role, path.name, factor)


# --- the clock ------------------------------------------------------------------------------------

class ClockedForward:
    """A batched forward (segments -> logits) held to a curve: the real forward runs, then the clock
    sleeps out the rest of the curve's time for its shapes. Longer real forwards are kept and counted."""

    def __init__(self, forward: Callable[[Sequence], list], curve: ForwardCurve):
        self._forward = forward
        self.curve = curve
        self._overruns = 0
        role = curve.role
        self._counted = metrics.SIMULATED_FORWARDS.labels(role=role)
        self._overrun = metrics.SIMULATED_OVERRUNS.labels(role=role)
        self._overrun_ms = metrics.SIMULATED_OVERRUN_MS.labels(role=role)
        self._real_ms = metrics.SIMULATED_REAL_MS.labels(role=role)

    def __call__(self, segments: Sequence) -> list:
        start = time.perf_counter()
        out = self._forward(segments)
        real_ms = (time.perf_counter() - start) * 1e3
        target_ms = forward_ms(self.curve, [len(s.token_ids) for s in segments if s.logit_rows],
                               [len(s.token_ids) for s in segments if not s.logit_rows])
        self._counted.inc()
        self._real_ms.inc(real_ms)
        if real_ms > target_ms:
            self._overrun.inc()
            self._overrun_ms.inc(real_ms - target_ms)
            self._overruns += 1
            if self._overruns <= OVERRUN_LOGS:
                log.warning("a forward took longer than the cost model allows; its real time is kept",
                            extra={"role": self.curve.role, "real_ms": round(real_ms, 3),
                                   "curve_ms": round(target_ms, 3), "segments": len(segments)})
        else:
            time.sleep((target_ms - real_ms) / 1e3)
        return out
