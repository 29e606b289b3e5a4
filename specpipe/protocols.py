"""One protocol per role. Each has an in-process implementation (in the service's folder) and a
gRPC client (specpipe.rpc.clients); the orchestrator only sees these."""

from __future__ import annotations

from typing import Protocol, Sequence

from specpipe.types import Draft, ModelInfo, ProposeResult, SamplingParams, VerifyResult


class Verifier(Protocol):
    def info(self) -> ModelInfo: ...

    def prefill(self, session_id: str, prompt_ids: Sequence[int]) -> int:
        """Open a session with the prompt in its KV cache; returns the context length."""

    def verify(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams) -> VerifyResult:
        """Verify a draft tree in one forward pass, append accepted tokens + correction."""

    def release(self, session_id: str) -> bool: ...


class Drafter(Protocol):
    def info(self) -> ModelInfo: ...

    def propose(
        self, session_id: str, context: Sequence[int], draft_len: int, width: int, sampling: SamplingParams
    ) -> ProposeResult:
        """Draft up to draft_len tokens (a chain, or a tree of top-width alternatives) after context."""

    def release(self, session_id: str) -> bool: ...
