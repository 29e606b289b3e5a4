-- Multi-Level N-gram lookup of up to k tokens in a session's verifier table
-- (specpipe.core.ngram.mln_lookup over that one table), in ONE call.
-- KEYS[1]: the table hash {s:<id>}:verifier; field = prefix "t1,...,t_{n-1}", value = continuations
-- "c1,c2,..." most recent first.
-- ARGV: max_n, k, width, context suffix tokens (the last max_n-1 at most).
-- Returns {tokens, parents, levels}: chain nodes each followed by their sibling alternatives (only at
-- the first step); parents are 0-based, -1 = the root; levels = the n of each hit.
local max_n = tonumber(ARGV[1])
local k = tonumber(ARGV[2])
local width = tonumber(ARGV[3])
local suffix = {}
for i = 4, #ARGV do
  suffix[#suffix + 1] = ARGV[i]
end

-- ANPD Algorithm 2: the longest suffix first.
local function longest_match()
  for n = math.min(max_n, #suffix + 1), 2, -1 do
    local continuations = redis.call("HGET", KEYS[1], table.concat(suffix, ",", #suffix - n + 2, #suffix))
    if continuations then
      return continuations, n
    end
  end
  return nil, 0
end

local tokens, parents, levels = {}, {}, {}
local parent = -1
for depth = 1, k do
  local continuations, n = longest_match()
  if not continuations then
    break
  end
  local limit = 1
  if depth == 1 then
    limit = width
  end
  local chain_parent = parent
  local position = 0
  for token in string.gmatch(continuations, "[^,]+") do
    if position >= limit then
      break
    end
    tokens[#tokens + 1] = tonumber(token)
    parents[#parents + 1] = chain_parent
    levels[#levels + 1] = n
    if position == 0 then
      parent = #tokens - 1
      suffix[#suffix + 1] = token
      if #suffix > max_n - 1 then
        table.remove(suffix, 1)
      end
    end
    position = position + 1
  end
end
return {tokens, parents, levels}
