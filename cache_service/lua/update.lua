-- Record n-grams in one table hash (specpipe.ngram.record_all), in ONE call: a session's verifier
-- branches (apply_branches) or a global update (apply_updates).
-- KEYS[1]: the table hash written ({s:<id>}:verifier or {g}:ngram); field = prefix
-- "t1,t2,...", value = continuations "c1,c2,..." most recent first (LRU per prefix, Self-Draft).
-- KEYS[2..]: the session's other tables, whose TTL is refreshed along (a session has one TTL).
-- ARGV: max_n, max_continuations, ttl_ms (0 = no expiry), max_prefixes (0 = unbounded), then segments,
-- each: start (0-based), count, count tokens. Records tokens[start+1..] of every segment: a global
-- update is one segment, a branch is one segment whose start is its last token.
-- Returns the number of (prefix, next) pairs recorded.
local max_n = tonumber(ARGV[1])
local max_continuations = tonumber(ARGV[2])
local ttl_ms = tonumber(ARGV[3])
local max_prefixes = tonumber(ARGV[4])
local size = 0  -- prefixes in KEYS[1], tracked only when bounded
if max_prefixes > 0 then
  size = redis.call("HLEN", KEYS[1])
end

local recorded = 0
local function record(prefix, next_token)
  local old = redis.call("HGET", KEYS[1], prefix)
  if not old and max_prefixes > 0 then
    if size >= max_prefixes then
      return  -- the table is full: known prefixes still learn, new ones are dropped
    end
    size = size + 1
  end
  local continuations = {next_token}
  if old then
    for token in string.gmatch(old, "[^,]+") do
      if #continuations >= max_continuations then
        break
      end
      if token ~= next_token then
        continuations[#continuations + 1] = token
      end
    end
  end
  redis.call("HSET", KEYS[1], prefix, table.concat(continuations, ","))
  recorded = recorded + 1
end

local at = 5
while at <= #ARGV do
  local start, count = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  local tokens = {}
  for i = 1, count do
    tokens[i] = ARGV[at + 1 + i]  -- canonical decimal strings: compared as strings
  end
  at = at + 2 + count
  -- specpipe.ngram.ngram_updates: every new token after each of its prefixes, short ones first.
  for i = math.max(start + 1, 2), #tokens do
    for m = 1, math.min(max_n - 1, i - 1) do
      record(table.concat(tokens, ",", i - m, i - 1), tokens[i])
    end
  end
end
if ttl_ms > 0 then
  for _, key in ipairs(KEYS) do
    redis.call("PEXPIRE", key, ttl_ms)  -- refreshes an existing table, no-op on a missing one
  end
end
return recorded
