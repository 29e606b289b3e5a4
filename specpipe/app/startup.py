"""Start-up steps, each said when it starts and again with its time when it ends: loading a model's
weights, then making its forward ready (packing the weights for the CPU kernel, building that kernel
once for this CPU, the warm-up or the CUDA graphs), so a start-up of a minute is never a silent one.

A service (its logging configured: JSON or text) logs them as `startup` records with the step and
its seconds; a command without logging (generate, bench) prints them on stderr, where the weights'
progress bar is, and its stdout stays its result."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator

log = logging.getLogger("specpipe.startup")
IMPORTS = "importing torch and transformers"  # a command's first step: seconds, more on a cold disk


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """`what ...` now, `what: 1.2 s` when the body is done (nothing more if it fails: its error says it)."""
    _say(f"{what} ...", what, None)
    start = time.perf_counter()
    yield
    _say(f"{what}: {time.perf_counter() - start:.1f} s", what, time.perf_counter() - start)


def _say(line: str, what: str, seconds: float | None) -> None:
    if logging.getLogger().handlers:  # a service: its log, structured
        log.info(line, extra={"step": what, **({"seconds": round(seconds, 3)} if seconds is not None else {})})
    else:
        print(f"specpipe: {line}", file=sys.stderr, flush=True)
