"""specpipe: lossless speculative decoding as a distributed service (shared core)."""

__version__ = "0.1.0"
