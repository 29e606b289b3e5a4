-- Record a session's verifier branches in its verifier table (specpipe.core.ngram.apply_branches),
-- in ONE call.
-- KEYS[1]: the table hash {s:<id>}:verifier; field = prefix "t1,t2,...", value = continuations
-- "c1,c2,..." most recent first (LRU per prefix, Self-Draft).
-- ARGV: max_n, max_continuations, ttl_ms (> 0: the session's TTL, refreshed), then segments, each:
-- start (0-based), count, count tokens. Records tokens[start+1..] of every segment (a branch is one
-- segment whose start is its last token).
-- Returns the number of (prefix, next) pairs recorded.
local max_n = tonumber(ARGV[1])
local max_continuations = tonumber(ARGV[2])
local ttl_ms = tonumber(ARGV[3])

local recorded = 0
local function record(prefix, next_token)
  local old = redis.call("HGET", KEYS[1], prefix)
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

local at = 4
while at <= #ARGV do
  local start, count = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  local tokens = {}
  for i = 1, count do
    tokens[i] = ARGV[at + 1 + i]  -- canonical decimal strings: compared as strings
  end
  at = at + 2 + count
  -- specpipe.core.ngram.ngram_updates: every new token after each of its prefixes, short ones first.
  for i = math.max(start + 1, 2), #tokens do
    for m = 1, math.min(max_n - 1, i - 1) do
      record(table.concat(tokens, ",", i - m, i - 1), tokens[i])
    end
  end
end
redis.call("PEXPIRE", KEYS[1], ttl_ms)  -- refreshes an existing table, no-op on a missing one
return recorded
