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

__version__ = "0.1.0"
