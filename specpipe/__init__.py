"""specpipe: lossless speculative decoding as a distributed service (shared core)."""

import os

# MKL's fp32 GEMM (nn.Linear on the CPU) rounds a row differently with the number of rows beside it
# unless its conditional numerical reproducibility is strict; strict, every row is bitwise the same
# for any number of rows, which the batched forward's batch invariance needs (docs/batching.md).
# MKL reads this once, at its first call: set here, before anything of specpipe runs torch.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"
