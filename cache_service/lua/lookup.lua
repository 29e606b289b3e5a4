-- Multi-Level N-gram lookup of up to k tokens (specpipe.ngram.mln_lookup), in ONE call.
-- KEYS: table hashes in priority order (specpipe.ngram.TABLES): the session's verifier table, then
-- optionally the global one.
-- ARGV: max_n, k, width, context suffix tokens (the last max_n-1 at most).
-- Returns {tokens, parents, levels, sources}: chain nodes each followed by their sibling alternatives
-- (only at the first step); parents are 0-based, -1 = the root; levels = the n of each hit;
-- sources = the 0-based index in KEYS of the table of each hit.
local max_n = tonumber(ARGV[1])
local k = tonumber(ARGV[2])
local width = tonumber(ARGV[3])
local suffix = {}
for i = 4, #ARGV do
  suffix[#suffix + 1] = ARGV[i]
end

-- ANPD Algorithm 2: tables in order, and within a table the longest suffix first.
local function longest_match()
  for index, key in ipairs(KEYS) do
    for n = math.min(max_n, #suffix + 1), 2, -1 do
      local continuations = redis.call("HGET", key, table.concat(suffix, ",", #suffix - n + 2, #suffix))
      if continuations then
        return continuations, n, index - 1
      end
    end
  end
  return nil, 0, 0
end

local tokens, parents, levels, sources = {}, {}, {}, {}
local parent = -1
for depth = 1, k do
  local continuations, n, source = longest_match()
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
    sources[#sources + 1] = source
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
return {tokens, parents, levels, sources}
