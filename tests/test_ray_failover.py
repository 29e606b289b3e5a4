"""Session affinity and failover of the Ray deployment, as pure parts: the router's ranking of
replicas (deploy/ray/router.py) and the verifier that re-prefills a lost session
(deploy/ray/failover.py) over a real tiny ModelVerifier that loses its sessions."""

from __future__ import annotations

import pytest

from deploy.ray.failover import RecoveringVerifier
from specpipe.errors import FailedPrecondition, Unavailable
from specpipe.types import GenerationRequest, SpeculationOptions
from tests.golden import GOLDEN_PROMPTS, reference_greedy, run

router = pytest.importorskip("deploy.ray.router", reason="the ray extra runs the Ray router tests")

CASES = {  # pinned, candidates, sessions, queue_len, strict -> ranked
    "pinned, strict": ("b", ["a", "b", "c"], {"b": 5}, {}, True, ["b"]),
    "pinned, not strict: the rest by load": ("b", ["a", "b", "c"], {"a": 2}, {"c": 1}, False, ["b", "c", "a"]),
    "new session: fewest sessions first": (None, ["a", "b", "c"], {"a": 1, "c": 2}, {}, True, ["b", "a", "c"]),
    "equal sessions: shortest queue": (None, ["a", "b"], {"a": 1, "b": 1}, {"a": 3, "b": 0}, True, ["b", "a"]),
    "pinned replica gone: placed anew": ("z", ["a", "b"], {"z": 4, "a": 1}, {}, True, ["b", "a"]),
    "no candidates": ("a", [], {}, {}, True, []),
}


@pytest.mark.parametrize("pinned, candidates, sessions, queue_len, strict, ranked", CASES.values(), ids=CASES.keys())
def test_rank_replicas(pinned, candidates, sessions, queue_len, strict, ranked):
    assert router.rank_replicas(pinned, candidates, sessions, queue_len, strict) == ranked


class LosingVerifier:
    """A real verifier that loses a session's KV every `every` verifies, the way a replacement replica
    does not know it; with reply_lost the round was verified and only its reply is lost (UNAVAILABLE)."""

    def __init__(self, verifier, every: int, reply_lost: bool):
        self._verifier, self._every, self._reply_lost = verifier, every, reply_lost
        self.calls = self.losses = 0

    def info(self):
        return self._verifier.info()

    def prefill(self, session_id, prompt_ids):
        return self._verifier.prefill(session_id, prompt_ids)

    def verify(self, session_id, context_len, draft, sampling):
        self.calls += 1
        if self.calls % self._every:
            return self._verifier.verify(session_id, context_len, draft, sampling)
        self.losses += 1
        if self._reply_lost:
            self._verifier.verify(session_id, context_len, draft, sampling)
            self._verifier.release(session_id)
            raise Unavailable("replica lost after verifying")
        self._verifier.release(session_id)
        return self._verifier.verify(session_id, context_len, draft, sampling)  # unknown session

    def release(self, session_id):
        return self._verifier.release(session_id)


@pytest.mark.parametrize("reply_lost", [False, True], ids=["session unknown", "reply lost"])
def test_lost_sessions_reprefill_losslessly(tiny_tokenizer, tiny_verifier, tiny_drafter, reply_lost):
    from orchestrator.generator import Generator

    losing = LosingVerifier(tiny_verifier, every=3, reply_lost=reply_lost)
    generator = Generator(tiny_tokenizer, RecoveringVerifier(losing), {"model": tiny_drafter})
    speculation = SpeculationOptions(draft_len=4, schedule="branch", adaptive="off")
    for prompt in GOLDEN_PROMPTS[:3]:
        ids = tuple(tiny_tokenizer(prompt)["input_ids"])
        tokens, _ = run(generator, GenerationRequest(ids, 32, speculation=speculation))
        assert tokens == reference_greedy(tiny_verifier.model, ids, 32), prompt
    assert losing.losses > 0


def test_a_wrong_context_is_not_recovered(tiny_verifier):
    """FAILED_PRECONDITION from the caller's own mistake (a stale context_len) is raised, not retried."""
    from specpipe.types import EMPTY_DRAFT, GREEDY

    verifier = RecoveringVerifier(tiny_verifier)
    context_len = verifier.prefill("wrong-context", [1, 2, 3])
    try:
        with pytest.raises(FailedPrecondition, match="assumes"):
            verifier.verify("wrong-context", context_len + 1, EMPTY_DRAFT, GREEDY)
    finally:
        verifier.release("wrong-context")
