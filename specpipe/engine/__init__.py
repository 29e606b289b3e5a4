"""The model engine: loading models (and preparing the packaged ones), forward passes over per-session
KV caches (runner, kv), the batched forward and the scheduler that gathers it, CUDA graphs, the
packed CPU GEMM (native/) and the cores a process may use.

Imports specpipe.core, specpipe.config and specpipe.runtime; knows no service and no transport."""
