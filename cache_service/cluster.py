"""The n-gram store on a Redis Cluster: redis+cluster://[user:password@]host:port names one seed node
(rediss+cluster://... with TLS, the rediss:// query parameters alike); the client reads the slot map
from it, routes each call to the master of its keys' hash slot (a session's keys share the tag
{s:<id>}, a tenant's learned store {g:<tenant>} or {g}: docs/design.md, "Drafting") and follows a
failover on its own.

A master that dies costs the calls on its slots a bounded time, then Unavailable: an attempt ends at
a refused connection or a socket timeout, the client re-reads the slot map (CLUSTER SLOTS from a live
node) and tries RETRIES more times; a pipeline retries its failed commands one by one, one attempt
more. Once the replica is promoted, the retry lands on it: a client that meets the failover after
the promotion sees no failed call. redis-py routes a pipelined EVALSHA by asking its default node
COMMAND GETKEYS (one round trip more, and no route while that node is down) unless the call names its
node (target_nodes=client.get_node_from_key(key)); a plain EVALSHA it routes by itself."""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from cache_service.redis_store import redacted
from specpipe.core.errors import InvalidArgument, Unavailable

RETRIES = 1  # attempts after the first, each after a slot-map refresh: 2 timeouts at most (3 for a pipeline)


def node_url(url: str) -> str:
    """redis+cluster://... -> redis://..., rediss+cluster://... -> rediss://... (the seed node's URL)."""
    scheme, sep, rest = url.partition("://")
    if scheme not in ("redis+cluster", "rediss+cluster") or not sep:
        raise InvalidArgument(f"not a Redis Cluster URL: {redacted(url)}; use redis+cluster://host:port")
    return f"{scheme.removesuffix('+cluster')}://{rest}"


def connect_cluster(url: str, timeout_s: float = 1.0) -> RedisCluster:
    """A cluster client from a seed node's URL; it reads the slot map at once. Socket timeouts of
    timeout_s, RETRIES retries, no backoff. The slots need not all be covered: a shard that is down
    costs its own sessions' drafts. InvalidArgument for a database other than 0 (a cluster has one),
    Unavailable when no node answers as a cluster node."""
    seed = node_url(url)
    try:
        database = parse_url(seed).get("db", 0)
    except ValueError as err:
        raise InvalidArgument(f"redis cluster URL {redacted(url)}: {err}") from None
    if database != 0:
        raise InvalidArgument(f"redis cluster URL {redacted(url)}: a cluster has database 0 only")
    try:
        return RedisCluster.from_url(seed, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                     retry=Retry(NoBackoff(), RETRIES), require_full_coverage=False)
    except (redis.RedisError, RedisClusterException) as err:  # no seed answered (RedisClusterException)
        raise Unavailable(f"redis cluster at {redacted(url)}: {type(err).__name__}: {err}") from None
