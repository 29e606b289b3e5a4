"""Session affinity of the Ray deployment: the request router's ranking of replicas
(specpipe/rayserve/router.py), a pure function. Failover itself is specpipe.serving.failover's (tests/test_failover.py),
and on Ray tests/test_ray_serve.py kills a verifier replica mid-session."""

from __future__ import annotations

import pytest

router = pytest.importorskip("specpipe.rayserve.router", reason="the ray extra runs the Ray router tests")

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
