"""The cache service: the n-gram store (specpipe.ngram semantics) with two backends, in-memory
(memory.InMemoryNgramCache) and Redis via server-side Lua (redis_store.RedisNgramCache), and its
gRPC servicer. Backends must never block a generation: callers treat any error as "no draft"."""
