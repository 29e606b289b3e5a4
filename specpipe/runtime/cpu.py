"""CPU time by hop (docs/pipeline.md, "Where the time goes"): each role charges the CPU time its
threads spend in each part of a round to `specpipe_cpu_seconds_total{role, hop}`, so a load test or a
bench can say what a round and a token cost each hop, per role, on the clock that matters on a busy
machine (time.thread_time: the calling thread's CPU time, about half a microsecond a reading).

A thread's hops nest: `with hop(role, name):` charges the CPU time inside to that hop and stops
charging the hop around it meanwhile. A loop whose parts are only named at their end (the generation
loop's laps) calls `lap(role, part)`: the CPU time since the previous lap, less the nested hops', goes
to that part. What no hop names (gRPC's core threads, the message (de)serialization grpcio runs around
a handler, the garbage collector) stays in the process's own counter, process_cpu_seconds_total,
minus the hops.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator

from prometheus_client import Counter

from specpipe.runtime import metrics

_local = threading.local()


@functools.lru_cache(maxsize=None)
def counter(role: str, name: str) -> Counter:
    """The labelled child of specpipe_cpu_seconds_total (bound once: a labels() lookup costs a microsecond)."""
    return metrics.CPU_SECONDS.labels(role=role, hop=name)


class _Thread:
    """A thread's open hops (innermost last): [counter or None for a lapped loop, CPU s not yet charged]."""

    __slots__ = ("stack", "mark")

    def __init__(self):
        self.stack: list[list] = [[None, 0.0]]
        self.mark = time.thread_time()


def _state() -> _Thread:
    state = getattr(_local, "state", None)
    if state is None:
        state = _local.state = _Thread()
    return state


@contextlib.contextmanager
def hop(role: str, name: str) -> Iterator[None]:
    """Charge the calling thread's CPU time inside to (role, name), not to the hop around it."""
    state = _state()
    now = time.thread_time()
    state.stack[-1][1] += now - state.mark
    state.stack.append([counter(role, name), 0.0])
    state.mark = now
    try:
        yield
    finally:
        now = time.thread_time()
        charged, spent = state.stack.pop()
        charged.inc(spent + now - state.mark)
        state.mark = now


def lap(role: str, part: str) -> None:
    """Charge the calling thread's CPU time since its previous lap (nested hops aside) to (role, part)."""
    state = _state()
    now = time.thread_time()
    top = state.stack[-1]
    counter(role, part).inc(top[1] + now - state.mark)
    top[1] = 0.0
    state.mark = now


def start_laps() -> None:
    """Begin a lapped loop on this thread: what came before is not its first part's."""
    state = _state()
    state.stack[-1][1] = 0.0
    state.mark = time.thread_time()


def snapshot() -> dict[str, float]:
    """"role/hop" -> CPU seconds charged so far in this process, and "process" -> the process's CPU time."""
    spent = {f"{s.labels['role']}/{s.labels['hop']}": s.value
             for family in metrics.CPU_SECONDS.collect() for s in family.samples if s.name.endswith("_total")}
    spent["process"] = time.process_time()
    return spent


def since(before: dict[str, float]) -> dict[str, float]:
    """CPU seconds by hop (and the process's) since snapshot() gave before; hops that spent none left out."""
    spent = {name: seconds - before.get(name, 0.0) for name, seconds in snapshot().items()}
    return {name: seconds for name, seconds in spent.items() if seconds > 0}
