"""The cores of one process, shared by the forwards of the models it runs (docs/compiled-forward.md).

In the embedded default the verifier and the drafter run in one process. A packed forward that
runs alone takes every core the process has (`torch.get_num_threads()`; the kernel splits its column
panels over them); one that overlaps a forward of another role leaves a core to each forward in
flight. The count is taken again at every kernel call, so a long forward that a short one of the
other role overlapped for a while (a verification of a long n-gram draft beside the drafter's
warm-up) has every core back once that one ends. So where drafts do not pay and adaptive control
stops drafting, the verifier decodes on all the cores, as `generate()` would; where they pay, the
verifier and the drafter keep a core each.
The kernel computes every output column the same way on any number of threads, so this changes
timing only, never a token."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

import torch

_lock = threading.Lock()
_in_flight: Counter[str] = Counter()  # role -> forwards running now
_local = threading.local()


@contextlib.contextmanager
def forward(role: str) -> Iterator[None]:
    """Around one forward of role ("verifier", "drafter"): its kernel calls take the process's
    threads less one per forward of another role in flight at the time of each call (threads())."""
    with _lock:
        _in_flight[role] += 1
    _local.role = role
    try:
        yield
    finally:
        _local.role = None
        with _lock:
            _in_flight[role] -= 1


def threads() -> int:
    """The kernel threads of a kernel call now: in a forward, the process's threads less one per
    forward of another role in flight, at least one; outside one, the process's."""
    role = getattr(_local, "role", None)
    if role is None:
        return torch.get_num_threads()
    with _lock:
        others = sum(n for r, n in _in_flight.items() if r != role)
    return max(1, torch.get_num_threads() - others)


def set_threads(count: int) -> None:
    """The process's torch threads; 0: one per core this process may use (after any pinning)."""
    import os

    if count <= 0:
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(count)
