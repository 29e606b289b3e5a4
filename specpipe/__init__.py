"""specpipe: lossless speculative decoding as a distributed service: the shared layers.

Lowest first (docs/design.md, "Layers"; import-linter checks the order, .importlinter):
core < config < runtime < models (the packaged model files) < engine < v1 (generated stubs) < serving <
the roles (orchestrator, drafter_service, verifier_service, cache_service, which never import each
other) and devtools (local Redis launchers for development and tests) < app < bench, rayserve < cli. A
layer imports only layers below it."""

import os

# MKL's fp32 GEMM (nn.Linear on the CPU) rounds a row differently with the number of rows beside it
# unless its conditional numerical reproducibility is strict; strict, every row is bitwise the same
# for any number of rows, which the batched forward's batch invariance needs (docs/batching.md).
# MKL reads this once, at its first call: set here, before anything of specpipe runs torch.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# torch's OpenMP workers (its elementwise ops over more than ~32K values) sleep as soon as their work is done
# rather than spinning for milliseconds: the packed kernel's own threads (specpipe/engine/native) need the same
# cores next, and spinning OpenMP workers held them off (a 4-token forward on the main thread took 2-3x its time).
# libgomp reads this when torch loads it: it takes effect where specpipe is imported before torch (the CLI).
# CALLER_OMP_WAIT_POLICY is the caller's own (None: unset): what a process specpipe starts that is not
# specpipe's gets back (a llama.cpp baseline: its OpenMP threads, asleep at every barrier, ran at ~0.75x its speed).
CALLER_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
