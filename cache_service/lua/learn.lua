-- Learn one document into a tenant's learned store (specpipe.core.learned.learn and evict), in ONE call.
-- KEYS: the tenant's docs, counts, lru, digests, ix, state (one hash tag: redis_store.global_keys).
--   docs    hash  member -> the document's tokens as little-endian int32
--   counts  hash  member -> times learned
--   lru     zset  member scored by `used` (the store's clock when last learned or drafted from)
--   digests hash  sha1 of the packed tokens (learned.digest) -> member
--   ix      hash  index_n tokens packed -> occurrences packed as (doc, pos) int32 pairs, most recent first
--   state   hash  tokens (in all documents), last_id (the last document id issued), clock
-- A member is the document id as "%012d": the zset orders equal scores by member, so ties in `used`
-- go to the lower id, as learned.learn's min((used, id)).
-- ARGV: the document's tokens packed as little-endian int32, index_n, max_occurrences, max_tokens, ttl_ms.
-- Returns {the tokens added, the tokens the store holds now}: added is 0 for a repeat (which counts) or a
-- document of <= index_n or > max_tokens tokens. Every key of the tenant expires ttl_ms from now
-- (learned.LearnedConfig.ttl_s).
local docs, counts, lru, digests, ix, state = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local document = ARGV[1]
local index_n = tonumber(ARGV[2])
local max_occurrences = tonumber(ARGV[3])
local max_tokens = tonumber(ARGV[4])
local ttl_ms = tonumber(ARGV[5])
local length = #document / 4

local BATCH = 1000  -- index keys per HMGET / HSET (Lua's unpack takes a few thousand values at most)

-- The index key of the index_n tokens before position pos (0-based) of packed tokens.
local function index_key(packed, pos)
  return string.sub(packed, 4 * (pos - index_n) + 1, 4 * pos)
end

-- Rewrite the occurrences of every index key of packed tokens: edit(key, occurrences or false) gives
-- the new occurrences (false: none). One HMGET and one HSET (and HDEL) per BATCH keys; a key that
-- comes back within one document sees the value it was last given.
local function rewrite_index(packed, edit)
  local written = {}  -- key -> its occurrences as last given in this call (false: deleted)
  for first = index_n, #packed / 4 - 1, BATCH do
    local last = math.min(first + BATCH, #packed / 4) - 1
    local keys = {}
    for pos = first, last do
      keys[#keys + 1] = index_key(packed, pos)
    end
    local stored = redis.call("HMGET", ix, unpack(keys))
    local sets, deletes = {}, {}
    for i, key in ipairs(keys) do
      local old = stored[i]
      if written[key] ~= nil then
        old = written[key]
      end
      local new = edit(key, old, first + i - 1)
      if new ~= old then
        written[key] = new
        if new then
          sets[#sets + 1] = key
          sets[#sets + 1] = new
        else
          deletes[#deletes + 1] = key
        end
      end
    end
    if #sets > 0 then
      redis.call("HSET", ix, unpack(sets))
    end
    if #deletes > 0 then
      redis.call("HDEL", ix, unpack(deletes))
    end
  end
end

-- learned.evict: drop a document and its occurrences; returns the store's tokens after it.
local function evict(member)
  local victim = redis.call("HGET", docs, member)
  redis.call("ZREM", lru, member)
  redis.call("HDEL", counts, member)
  if not victim then  -- only if Redis itself evicted the key (maxmemory): nothing left to unindex
    return tonumber(redis.call("HGET", state, "tokens"))
  end
  redis.call("HDEL", docs, member)
  redis.call("HDEL", digests, redis.sha1hex(victim))
  local id = struct.pack("<i4", tonumber(member))
  rewrite_index(victim, function(key, occurrences)
    if not occurrences then
      return false
    end
    local kept = {}
    for at = 1, #occurrences, 8 do
      if string.sub(occurrences, at, at + 3) ~= id then
        kept[#kept + 1] = string.sub(occurrences, at, at + 7)
      end
    end
    if #kept == 0 then
      return false
    end
    if #kept * 8 == #occurrences then
      return occurrences
    end
    return table.concat(kept)
  end)
  return redis.call("HINCRBY", state, "tokens", -(#victim / 4))
end

local function learn()
  if length <= index_n or length > max_tokens then
    return 0
  end
  local clock = redis.call("HINCRBY", state, "clock", 1)
  local digest = redis.sha1hex(document)
  local known = redis.call("HGET", digests, digest)
  if known then
    redis.call("HINCRBY", counts, known, 1)
    redis.call("ZADD", lru, clock, known)
    return 0
  end
  local id = redis.call("HINCRBY", state, "last_id", 1)
  local member = string.format("%012d", id)
  redis.call("HSET", docs, member, document)
  redis.call("HSET", counts, member, 1)
  redis.call("ZADD", lru, clock, member)
  redis.call("HSET", digests, digest, member)
  local keep = 8 * (max_occurrences - 1)
  rewrite_index(document, function(key, occurrences, pos)
    local entry = struct.pack("<i4i4", id, pos)
    if occurrences then
      return entry .. string.sub(occurrences, 1, keep)
    end
    return entry
  end)
  local tokens = redis.call("HINCRBY", state, "tokens", length)
  while tokens > max_tokens do
    local oldest = redis.call("ZRANGE", lru, 0, 0)[1]
    if not oldest then
      break
    end
    tokens = evict(oldest)
  end
  return length
end

local added = learn()
for _, key in ipairs(KEYS) do
  redis.call("PEXPIRE", key, ttl_ms)  -- no-op on a key the tenant does not have (yet)
end
return {added, tonumber(redis.call("HGET", state, "tokens") or 0)}
