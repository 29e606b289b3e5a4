"""CUDA graph capture for the graphs mode (docs/compiled-forward.md): a forward over fixed input and
KV buffers is recorded once per shape and replayed, so a decoding step costs one launch instead of
hundreds (what SGLang does for its decode batches, without a compiler: capture takes seconds).
On a CPU nothing is captured and the same forward runs eagerly over the same buffers."""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Callable

import torch

_CAPTURED: weakref.WeakSet[Graph] = weakref.WeakSet()


class Graph:
    """fn (no arguments: it reads and writes fixed buffers) as a CUDA graph on CUDA, a call elsewhere."""

    def __init__(self, fn: Callable[[], torch.Tensor], device: torch.device):
        self.fn, self.device = fn, device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None  # the captured graph's output, overwritten by every replay

    @torch.inference_mode()
    def capture(self, pool: Any) -> None:
        """Record fn (after two runs on a side stream, as capture requires); no-op off CUDA. Graphs that
        never run at once share one memory pool (torch.cuda.graph_pool_handle())."""
        if self.device.type != "cuda":
            return
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.output = self.fn()
        self.graph = graph
        _CAPTURED.add(self)

    def release(self) -> None:
        """Drop the captured graph (fn runs eagerly from now on)."""
        if self.graph is not None:
            self.graph.reset()
        self.graph = self.output = None

    @torch.inference_mode()
    def __call__(self) -> torch.Tensor:
        """fn's output; a replay's belongs to the graph: copy what must outlive the next replay."""
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        assert self.output is not None  # captured with the graph
        return self.output


def new_pool(device: torch.device) -> Any:
    """A memory pool for graphs that never run at once (None off CUDA)."""
    return torch.cuda.graph_pool_handle() if device.type == "cuda" else None


@atexit.register
def release_all() -> None:
    """Drop every captured graph before the interpreter tears CUDA down: graphs left to that teardown
    have hung processes at exit (vllm-project/vllm#4263)."""
    for graph in list(_CAPTURED):
        graph.release()
