"""Soak of the learned store (specpipe.core.learned) on a real redis-server and in memory, in lockstep:
many documents with recurring parts into one tenant whose store is small, so that it evicts all the
time. The store stays within max_tokens, Redis's memory plateaus, both backends return the same
values and drafts throughout, and lookups keep drafting the recurring text. scripts/cache_soak.py
runs the same soak and prints the table (and the bytes per learned token that docs size Redis with).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Iterator

import pytest
import redis

from cache_service.memory import InMemoryNgramCache
from cache_service.redis_store import RedisNgramCache, connect, global_keys
from specpipe.core.learned import LearnedConfig
from specpipe.core.ngram import NgramConfig
from tests.redis_harness import redis_server

VOCAB = 50_000
TEMPLATES = 40          # recurring texts (an agent's formats, one repository's code), TEMPLATE_TOKENS each
TEMPLATE_TOKENS = 300
PROBES = 20             # lookups per sample: a context inside a template, which must draft its continuation
PROBE_K = 8


@dataclass(frozen=True)
class Sample:
    documents: int       # learned so far
    tokens: int          # in the store (Redis's state)
    used_memory: int     # Redis INFO used_memory, bytes
    drafted: float       # share of the probes that drafted the template's own continuation
    learn_ms: float      # median update_global on Redis over the interval
    lookup_ms: float     # median lookup on Redis over the probes


def templates(rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(VOCAB) for _ in range(TEMPLATE_TOKENS)] for _ in range(TEMPLATES)]


def documents(rng: random.Random, recurring: list[list[int]]) -> Iterator[list[int]]:
    """Documents of 1 to 3 template fragments (40 to 200 tokens from anywhere in a template) joined by
    unique text; one in ten is unique text only."""
    while True:
        if rng.random() < 0.1:
            yield [rng.randrange(VOCAB) for _ in range(rng.randint(50, 400))]
            continue
        document: list[int] = []
        for _ in range(rng.randint(1, 3)):
            template = rng.choice(recurring)
            start = rng.randrange(TEMPLATE_TOKENS - 40)
            document += template[start:start + rng.randint(40, 200)]
            document += [rng.randrange(VOCAB) for _ in range(rng.randint(0, 30))]
        yield document


def probe(rng: random.Random, recurring: list[list[int]]) -> tuple[list[int], list[int]]:
    """A context of 40 tokens inside a template and the template's next PROBE_K tokens."""
    template = rng.choice(recurring)
    at = rng.randrange(40, TEMPLATE_TOKENS - PROBE_K)
    return template[at - 40:at], template[at:at + PROBE_K]


def soak(redis_store: RedisNgramCache, client: redis.Redis, memory_store: InMemoryNgramCache | None,
         num_documents: int, samples: int, seed: int = 0) -> Iterator[Sample]:
    """Learn num_documents into the default tenant of both stores (memory_store None: Redis alone),
    yielding a Sample every num_documents // samples documents (client: of the same Redis, for INFO);
    asserts that both stores agree."""
    rng = random.Random(seed)
    recurring = templates(rng)
    stream, state = documents(rng, recurring), global_keys("")[-1]
    every = max(1, num_documents // samples)
    learn_ms: list[float] = []
    for learned_so_far in range(1, num_documents + 1):
        document = next(stream)
        started = time.perf_counter()
        added = redis_store.update_global(document)
        learn_ms.append((time.perf_counter() - started) * 1000)
        if memory_store is not None:
            assert memory_store.update_global(document) == added
        if learned_so_far % every:
            continue
        drafted, lookup_ms = 0, []
        for i in range(PROBES):
            context, continuation = probe(rng, recurring)
            started = time.perf_counter()
            found = redis_store.lookup(f"soak-{i}", context, PROBE_K, 1)
            lookup_ms.append((time.perf_counter() - started) * 1000)
            if memory_store is not None:
                assert memory_store.lookup(f"soak-{i}", context, PROBE_K, 1) == found
            drafted += bool(found.draft.tokens) and list(found.draft.tokens) == continuation[:len(found.draft)]
        yield Sample(learned_so_far, int(client.hget(state, "tokens") or 0), client.info("memory")["used_memory"],
                     drafted / PROBES, statistics.median(learn_ms), statistics.median(lookup_ms))
        learn_ms.clear()


def plateaus(values: list[float], tolerance: float = 0.1) -> bool:
    """Whether the last quarter of values stays within tolerance of its mean."""
    tail = values[-max(1, len(values) // 4):]
    mean = statistics.fmean(tail)
    return all(abs(value - mean) <= tolerance * mean for value in tail)


@pytest.mark.slow  # about 3 minutes on 2 cores: 20k documents through Redis and the in-memory store
def test_a_small_store_under_many_documents_stays_bounded_and_keeps_drafting():
    max_tokens = 50_000
    config = NgramConfig(learned=LearnedConfig(max_tokens=max_tokens))
    with redis_server() as server:
        store, client = RedisNgramCache.from_url(server.url, config, timeout_s=10), connect(server.url)
        baseline = client.info("memory")["used_memory"]
        samples = list(soak(store, client, InMemoryNgramCache(config), num_documents=20_000, samples=40))
        store.close()
    assert all(s.tokens <= max_tokens for s in samples)
    assert samples[-1].tokens > 0.9 * max_tokens  # full: evicting, not empty
    assert plateaus([s.used_memory for s in samples])
    late = samples[len(samples) // 2:]
    assert statistics.fmean(s.drafted for s in late) >= 0.8  # the recurring text keeps drafting
    bytes_per_token = (statistics.fmean(s.used_memory for s in late) - baseline) / statistics.fmean(
        s.tokens for s in late
    )
    assert 20 < bytes_per_token < 400  # scripts/cache_soak.py reports it
