"""The learned store on a private redis-server: a soak table (tests/test_cache_soak.py's soak: documents
with recurring parts into one tenant whose store is small) with Redis's memory per learned token, and
the median latency of update_global and lookup for a 300-token document.

    PYTHONPATH=. python scripts/cache_soak.py --documents 20000 --max-tokens 50000

A measurement, not a test (the test asserts the bounds): bytes per token = (used_memory - the empty
server's) / tokens in the store, over the second half of the soak. Latencies are client-side round
trips on loopback (redis-py, one connection), median over --calls calls, and the time Redis spent
in the scripts (INFO commandstats), which a busy client machine does not inflate.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Callable

import redis

from cache_service.memory import InMemoryNgramCache
from cache_service.redis_store import RedisNgramCache, connect
from specpipe.core.learned import MATCH_TOKENS, LearnedConfig
from specpipe.core.ngram import NgramConfig
from specpipe.devtools import local_redis
from tests.test_cache_soak import VOCAB, soak


def timed(client: redis.Redis, call: Callable[[int], object], calls: int) -> tuple[float, float]:
    """(median ms of call(i) for i < calls, as the client sees it; mean µs per call spent in Redis's
    EVALSHAs, from INFO commandstats)."""
    times = []
    client.config_resetstat()
    for i in range(calls):
        started = time.perf_counter()
        call(i)
        times.append((time.perf_counter() - started) * 1000)
    server_us = client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0)
    return statistics.median(times), server_us / calls


def latencies(url: str, calls: int, document_tokens: int) -> tuple[list[tuple[str, float, float]], float]:
    """(what, median ms, server µs per call) of update_global and lookup with document_tokens-token documents of unique
    text, and the Redis memory per token such text costs (each position a new index key)."""
    rng = random.Random(1)
    docs = [[rng.randrange(VOCAB) for _ in range(document_tokens)] for _ in range(calls)]
    client = connect(url)
    client.flushdb()
    empty = client.info("memory")["used_memory"]
    roomy = RedisNgramCache.from_url(url, NgramConfig(), timeout_s=10)
    rows = [
        ("update_global, a new document, no eviction", *timed(client, lambda i: roomy.update_global(docs[i]), calls))
    ]
    unique_bytes_per_token = (client.info("memory")["used_memory"] - empty) / (calls * document_tokens)
    rows.append(("update_global, a repeat", *timed(client, lambda i: roomy.update_global(docs[i]), calls)))
    contexts = [docs[i][100:100 + MATCH_TOKENS] for i in range(calls)]
    rows.append(("lookup (verifier table + learned store), k=8: drafts 8",
                 *timed(client, lambda i: roomy.lookup(f"s{i}", contexts[i], 8, 1), calls)))
    rows.append(
        ("lookup, no match", *timed(client, lambda i: roomy.lookup(f"s{i}", [i, i + 1, i + 2] * 10, 8, 1), calls))
    )
    verifier_only = RedisNgramCache.from_url(url, NgramConfig(use_global=False), timeout_s=10)
    rows.append(("lookup, verifier table only (use_global off)",
                 *timed(client, lambda i: verifier_only.lookup(f"s{i}", contexts[i], 8, 1), calls)))
    client.flushdb()
    full = RedisNgramCache.from_url(url, NgramConfig(learned=LearnedConfig(max_tokens=document_tokens * calls // 4)),
                                    timeout_s=10)
    rows.append(("update_global, a new document into a full store (evicts one)",
                 *timed(client, lambda i: full.update_global(docs[i]), calls)))
    for store in (roomy, verifier_only, full):
        store.close()
    return rows, unique_bytes_per_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--max-tokens", type=int, default=50_000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument(
        "--memory", action="store_true", help="also run the in-memory store in lockstep (checks equality)"
    )
    parser.add_argument("--calls", type=int, default=1000, help="calls per latency median")
    parser.add_argument("--document-tokens", type=int, default=300)
    args = parser.parse_args()
    config = NgramConfig(learned=LearnedConfig(max_tokens=args.max_tokens))
    with local_redis.local_redis() as server:
        store, client = RedisNgramCache.from_url(server.url, config, timeout_s=10), connect(server.url)
        baseline = client.info("memory")["used_memory"]
        print(f"soak: {args.documents} documents, max_tokens {args.max_tokens}, redis {client.info()['redis_version']}")
        print("| documents | tokens | used_memory MiB | bytes/token | drafted | learn ms | lookup ms |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        samples = []
        for s in soak(store, client, InMemoryNgramCache(config) if args.memory else None, args.documents, args.samples):
            samples.append(s)
            print(
                f"| {s.documents} | {s.tokens} | {s.used_memory / 2**20:.2f} "
                f"| {(s.used_memory - baseline) / s.tokens:.1f} "
                f"| {s.drafted:.2f} | {s.learn_ms:.2f} | {s.lookup_ms:.2f} |",
                flush=True,
            )
        store.close()
        late = samples[len(samples) // 2:]
        per_token = (statistics.fmean(s.used_memory for s in late) - baseline) / statistics.fmean(
            s.tokens for s in late
        )
        print(f"\nbytes per learned token (the soak's second half): {per_token:.1f}")
        rows, unique_bytes_per_token = latencies(server.url, args.calls, args.document_tokens)
        print(f"bytes per learned token of unique text: {unique_bytes_per_token:.1f}\n")
        print(f"latency of {args.calls} calls, {args.document_tokens}-token documents: client median ms, "
              "server µs per call (EVALSHA time, mean)")
        for what, ms, server_us in rows:
            print(f"  {what}: {ms:.3f} ms, {server_us:.0f} µs in Redis")


if __name__ == "__main__":
    main()
