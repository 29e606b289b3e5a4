"""The cache service: the n-gram store (specpipe.core.ngram semantics) with two backends, in-memory
(memory.InMemoryNgramCache) and Redis via server-side Lua (redis_store.RedisNgramCache), its gRPC
servicer and stores.open_store (the store a --cache URL names); the private redis-server of `specpipe
up --cache redis` and the tests is specpipe.devtools'. Backends must never block a generation: callers
treat any error as "no draft"."""
