"""One protocol per role. Each has an in-process implementation (in the service's folder) and a
gRPC client (specpipe.serving.clients); the orchestrator only sees these."""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from specpipe.core.ngram import NgramDraft
from specpipe.core.types import (
    Draft,
    ModelInfo,
    ProposeRequest,
    ProposeResult,
    RoundRequest,
    SamplingParams,
    VerifyResult,
)


class Verifier(Protocol):
    def info(self) -> ModelInfo: ...

    def prefill(self, session_id: str, prompt_ids: Sequence[int]) -> int:
        """Open a session with the prompt in its KV cache; returns the context length."""

    def verify(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams) -> VerifyResult:
        """Verify a draft tree in one forward pass, append accepted tokens + correction."""

    def release(self, session_id: str) -> bool: ...


class RoundVerifier(Verifier, Protocol):
    """A verifier that also takes rounds without waiting for them (a stream of rounds,
    specpipe.serving.verify_stream): submit queues them together, done(pending) tells of each whose
    forward is over, finish(pending) gives its result."""

    @property
    def batched(self) -> bool: ...

    def submit(self, rounds: Sequence[RoundRequest], done: Callable[[Any], None]) -> list[Any]: ...

    def finish(self, pending: Any) -> VerifyResult: ...


class Drafter(Protocol):
    def info(self) -> ModelInfo: ...

    def propose(self, request: ProposeRequest) -> ProposeResult:
        """Draft after request.context. Several proposals for one session may be in flight (branch
        schedule) without harming each other; one with an epoch older than the session's newest
        may raise Aborted (a drafter with per-session state stops work nobody will use)."""

    def release(self, session_id: str) -> bool: ...


class NgramCache(Protocol):
    """The n-gram store. Two sources: the session's verifier table (the verifier's argmax after draft
    nodes it did not accept; specpipe.core.ngram, Multi-Level N-gram), which expires session_ttl_s
    after its last update, and the tenant's learned store of finished outputs and corpora, shared by
    all the tenant's sessions (specpipe.core.learned: bounded in tokens, LRU, with a TTL). A session's
    own context is searched by the n-gram drafter in the context it is given
    (specpipe.core.ngram.context_lookup), not stored."""

    def lookup(self, session_id: str, context_suffix: Sequence[int], k: int, width: int,
               tenant: str = "") -> NgramDraft:
        """A draft of up to k tokens after context_suffix (up to its last MATCH_TOKENS matter): the
        better (specpipe.core.ngram.better) of the session's table's and the tenant's learned store's."""

    def record_branches(self, session_id: str, branches: Sequence[Sequence[int]]) -> int:
        """For each branch, record its last token after its last 1..N-1 tokens before it, in the
        session's verifier table (specpipe.core.ngram.verifier_branches builds them). Returns pairs recorded."""

    def update_global(self, tokens: Sequence[int], tenant: str = "") -> int:
        """Learn tokens as a document of the tenant's learned store (specpipe.core.learned.learn);
        returns the tokens added (0 for a repeat, which counts)."""

    def release(self, session_id: str) -> bool:
        """Drop a session's tables; False if it had none (never updated, released or expired)."""

    def close(self) -> None:
        """Let go of the store's connections (an in-process store has none)."""
