"""The n-gram store a URL names (the --cache flag): the one place that maps URL forms to backends."""

from __future__ import annotations

from specpipe.core.errors import InvalidArgument
from specpipe.core.ngram import NgramConfig
from specpipe.core.protocols import NgramCache
from specpipe.serving.security import Tls

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
GRPC_SCHEME = "grpc://"
FORMS = ("memory (this process)", "redis://[user:password@]host:port[/db]", "rediss://... (TLS)",
         "unix:///path/to/redis.sock", "redis+cluster://[user:password@]host:port (a Redis Cluster, one seed node)",
         "rediss+cluster://... (a Redis Cluster, TLS)", "grpc://host:port (a cache service)")


def open_store(url: str, config: NgramConfig = NgramConfig(), timeout_s: float = 1.0,
               tls: Tls | None = None) -> NgramCache:
    """The store named by url: "memory" -> InMemoryNgramCache, a Redis URL -> RedisNgramCache (shared
    by every replica; redis+cluster:// on a Redis Cluster, cache_service.cluster), "grpc://host:port" ->
    a client of a cache service. timeout_s bounds each call (Redis socket timeouts, the gRPC deadline);
    config applies to the stores in this process only (a cache service has its own); tls: of the
    channel to a cache service (specpipe.serving.security.Tls)."""
    if url == "memory":
        from cache_service.memory import InMemoryNgramCache

        return InMemoryNgramCache(config)
    if url.startswith(CLUSTER_SCHEMES):
        from cache_service.cluster import connect_cluster
        from cache_service.redis_store import RedisNgramCache, redacted

        return RedisNgramCache(connect_cluster(url, timeout_s), config, redacted(url))
    if url.startswith(REDIS_SCHEMES):
        from cache_service.redis_store import RedisNgramCache

        return RedisNgramCache.from_url(url, config, timeout_s)
    if url.startswith(GRPC_SCHEME) and url[len(GRPC_SCHEME):]:
        from specpipe.serving.cache_client import CacheClient

        return CacheClient(url[len(GRPC_SCHEME):], timeout_s=timeout_s, tls=tls)
    hint = " (the bare word redis, a local redis-server, is for `specpipe up` only)" if url == "redis" else ""
    raise InvalidArgument(f"unknown n-gram store {url!r}{hint}; use one of: {', '.join(FORMS)}")
