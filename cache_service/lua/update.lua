-- Record tokens[start+1..] in one n-gram table hash (specpipe.ngram.apply_updates), in ONE call.
-- KEYS[1]: the table hash ({s:<id>}:ngram or {g}:ngram); field = prefix "t1,t2,...", value =
-- continuations "c1,c2,..." most recent first (LRU per prefix, Self-Draft).
-- ARGV: max_n, max_continuations, ttl_ms (0 = no expiry), start (0-based), tokens...
-- Returns the number of (prefix, next) pairs recorded.
local max_n = tonumber(ARGV[1])
local max_continuations = tonumber(ARGV[2])
local ttl_ms = tonumber(ARGV[3])
local start = tonumber(ARGV[4])
local tokens = {}
for i = 5, #ARGV do
  tokens[#tokens + 1] = ARGV[i]  -- canonical decimal strings: compared as strings
end

local recorded = 0
for i = math.max(start + 1, 2), #tokens do
  local next_token = tokens[i]
  for m = 1, math.min(max_n - 1, i - 1) do
    local prefix = table.concat(tokens, ",", i - m, i - 1)
    local continuations = {next_token}
    local old = redis.call("HGET", KEYS[1], prefix)
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
end
if ttl_ms > 0 then
  redis.call("PEXPIRE", KEYS[1], ttl_ms)  -- refreshes an existing session, no-op on a missing one
end
return recorded
