"""A verifier whose sessions survive the loss of their replica (DESIGN section 7: the orchestrator
holds the truth). It records each session's context, the prompt and every verified token; when a
verify fails because the session's replica is gone (UNAVAILABLE) or does not hold the session
(FAILED_PRECONDITION: a replacement replica, an expired session), it prefills that context again,
which the router places on a live replica, and retries the verify once. The retried round is the
same round: no token is lost, repeated or changed.
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

from specpipe.errors import FailedPrecondition, SpecpipeError, Unavailable
from specpipe.protocols import Verifier
from specpipe.types import Draft, ModelInfo, SamplingParams, VerifyResult

log = logging.getLogger("specpipe.failover")

RECOVERABLE = (Unavailable, FailedPrecondition)


class RecoveringVerifier:
    def __init__(self, verifier: Verifier):
        self._verifier = verifier
        self._contexts: dict[str, list[int]] = {}  # session_id -> prompt + verified tokens
        self._lock = threading.Lock()

    def info(self) -> ModelInfo:
        return self._verifier.info()

    def prefill(self, session_id: str, prompt_ids: Sequence[int]) -> int:
        try:
            context_len = self._verifier.prefill(session_id, prompt_ids)
        except Unavailable as err:  # the replica chosen went away: the router places it again
            log.warning("prefill failed, retrying", extra={"session_id": session_id, "error": str(err)})
            context_len = self._verifier.prefill(session_id, prompt_ids)
        with self._lock:
            self._contexts[session_id] = list(prompt_ids)
        return context_len

    def verify(self, session_id: str, context_len: int, draft: Draft, sampling: SamplingParams) -> VerifyResult:
        try:
            result = self._verifier.verify(session_id, context_len, draft, sampling)
        except RECOVERABLE as err:
            with self._lock:
                context = list(self._contexts.get(session_id, ()))
            if len(context) != context_len:  # not a lost session: the caller's own mistake
                raise
            log.warning("session lost, prefilling it again", extra={"session_id": session_id, "error": str(err),
                                                                    "context_len": context_len})
            self._reprefill(session_id, context)
            result = self._verifier.verify(session_id, context_len, draft, sampling)
        with self._lock:
            if session_id in self._contexts:
                self._contexts[session_id].extend(result.emitted)
        return result

    def _reprefill(self, session_id: str, context: list[int]) -> None:
        try:  # a replica that still holds a stale copy of the session refuses a second prefill
            self._verifier.release(session_id)
        except SpecpipeError:
            pass
        self._verifier.prefill(session_id, context)

    def release(self, session_id: str) -> bool:
        with self._lock:
            self._contexts.pop(session_id, None)
        return self._verifier.release(session_id)
