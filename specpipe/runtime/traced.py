"""The roles' protocols with a span around each call (specpipe.runtime.tracing): what the composition
root and the Generator put around a verifier, a drafter and an n-gram store when tracing is on, and
only then (off, the objects are used as they are: no wrapper, no cost). Each span is a child of the
calling context's span and is made only inside a traced request; the call itself is unchanged."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specpipe.core.protocols import Drafter, NgramCache, Verifier
from specpipe.core.types import Draft, ProposeRequest, ProposeResult, SamplingParams, VerifyResult
from specpipe.runtime import tracing


def verdict_attributes(result: VerifyResult) -> dict[str, Any]:
    """What a round's verdict says, as span attributes."""
    return {"specpipe.accepted": len(result.accepted_tokens), "specpipe.verify_ms": result.verify_ms,
            "specpipe.batch.sessions": result.batch_sessions, "specpipe.batch.tokens": result.batch_tokens}


class _Delegating:
    """Everything not traced goes to the wrapped object as it is."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TracedVerifier(_Delegating):
    """A verifier's prefill and rounds as spans (the orchestrator's side of the hop: prefill, verify)."""

    def __init__(self, inner: Verifier):
        super().__init__(inner)
        if hasattr(inner, "verify_async"):  # schedules look for it: only where the inner one has it
            self.verify_async = self._verify_async

    def prefill(self, session_id: str, prompt_ids: Sequence[int]) -> int:
        with tracing.span("prefill", {"specpipe.prompt_tokens": len(prompt_ids)}):
            return int(self._inner.prefill(session_id, prompt_ids))

    def verify(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams) -> VerifyResult:
        with tracing.span("verify", {"specpipe.drafted": len(draft)}) as span:
            result: VerifyResult = self._inner.verify(session_id, context_len, draft, sampling)
            if span is not None:
                span.set_attributes(verdict_attributes(result))
            return result

    def _verify_async(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams,
                      ) -> Callable[[], VerifyResult]:
        """The round sent inside its span (the client puts its traceparent in the round); the span
        ends with the verdict."""
        parent = tracing.current()
        if parent is None:
            return self._inner.verify_async(session_id, context_len, draft, sampling)
        span = tracing.start("verify", parent, {"specpipe.drafted": len(draft)}, kind="client")
        try:
            with tracing.scope(span):
                sent = self._inner.verify_async(session_id, context_len, draft, sampling)
        except BaseException:
            span.end()
            raise

        def verdict() -> VerifyResult:
            try:
                with tracing.scope(span):  # a failover's re-prefill and resend are the round's
                    result: VerifyResult = sent()
                span.set_attributes(verdict_attributes(result))
                return result
            finally:
                span.end()

        return verdict


class TracedDrafter(_Delegating):
    """A drafter's proposals as spans: "draft" where the orchestrator asks, "propose" where a drafter
    service answers (attributes: the draft asked for and the one given)."""

    def __init__(self, inner: Drafter, name: str, method: str):
        super().__init__(inner)
        self._name, self._method = name, method

    def propose(self, request: ProposeRequest) -> ProposeResult:
        attributes = {"specpipe.method": self._method, "specpipe.draft_len": request.draft_len,
                      "specpipe.epoch": request.epoch}
        with tracing.span(self._name, attributes) as span:
            result: ProposeResult = self._inner.propose(request)
            if span is not None:
                span.set_attributes({"specpipe.drafted": len(result.draft), "specpipe.draft_ms": result.draft_ms})
            return result


class TracedStore(_Delegating):
    """An n-gram store's calls as spans: store.lookup (hit: it drafted), store.record_branches,
    store.update_global, store.release."""

    def lookup(self, session_id: str, context_suffix: Sequence[int], k: int, width: int, tenant: str = "") -> Any:
        with tracing.span("store.lookup", {"specpipe.draft_len": k}) as span:
            found = self._inner.lookup(session_id, context_suffix, k, width, tenant)
            if span is not None:
                span.set_attributes({"specpipe.drafted": len(found.draft), "specpipe.hit": len(found.draft) > 0})
            return found

    def record_branches(self, session_id: str, branches: Sequence[Sequence[int]]) -> int:
        with tracing.span("store.record_branches", {"specpipe.branches": len(branches)}):
            return int(self._inner.record_branches(session_id, branches))

    def update_global(self, tokens: Sequence[int], tenant: str = "") -> int:
        with tracing.span("store.update_global", {"specpipe.tokens": len(tokens)}):
            return int(self._inner.update_global(tokens, tenant))

    def release(self, session_id: str) -> bool:
        with tracing.span("store.release"):
            return bool(self._inner.release(session_id))


def traced_verifier(verifier: Verifier) -> Verifier:
    """verifier, with spans where tracing is on."""
    return TracedVerifier(verifier) if tracing.ACTIVE else verifier


def traced_drafter(drafter: Drafter, method: str, name: str = "draft") -> Drafter:
    return TracedDrafter(drafter, name, method) if tracing.ACTIVE else drafter


def traced_store(store: NgramCache) -> NgramCache:
    return TracedStore(store) if tracing.ACTIVE else store
