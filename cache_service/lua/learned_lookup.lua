-- Draft from a tenant's learned store (specpipe.core.learned.lookup: candidates, then walk), in ONE call.
-- KEYS: the tenant's docs, counts, lru, digests, ix, state (layout: learn.lua).
-- ARGV: the context's last MATCH_TOKENS tokens packed as little-endian int32, index_n, k (>= 1),
-- width, min_share (a float's repr: the same double as Python's), reach.
-- Returns {tokens, parents, weights, totals, match}: the nodes in learned.walk's layout, each with its
-- weight and the total weight at its depth (its share is weight / total: evidence() is computed by the
-- caller, Redis replies carry no floats), and the longest match (0: no draft). The documents that
-- drafted the first token become the most recently used (the clock ticks once).
local docs, counts, lru, ix, state = KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6]
local suffix = ARGV[1]
local index_n = tonumber(ARGV[2])
local k = tonumber(ARGV[3])
local width = tonumber(ARGV[4])
local min_share = tonumber(ARGV[5])
local reach = tonumber(ARGV[6])
local n = #suffix / 4
local NONE = {{}, {}, {}, {}, 0}

-- The token at 0-based position pos of packed tokens, as its 4 bytes.
local function token_at(packed, pos)
  return string.sub(packed, 4 * pos + 1, 4 * pos + 4)
end

-- learned.candidates: the occurrences of the longest match, in index order.
local function candidates()
  if n < index_n then
    return {}, 0
  end
  local occurrences = redis.call("HGET", ix, string.sub(suffix, 4 * (n - index_n) + 1))
  if not occurrences then
    return {}, 0
  end
  local documents, weights, found, longest = {}, {}, {}, 0
  for at = 1, #occurrences, 8 do
    local id, pos = struct.unpack("<i4i4", occurrences, at)
    local member = string.format("%012d", id)
    if documents[member] == nil then
      documents[member] = redis.call("HGET", docs, member)
      weights[member] = tonumber(redis.call("HGET", counts, member))
    end
    local document = documents[member]
    if document then  -- false only if Redis itself evicted a key (maxmemory)
      local match = index_n
      while match < n and pos - match - 1 >= 0
          and token_at(document, pos - match - 1) == token_at(suffix, n - match - 1) do
        match = match + 1
      end
      found[#found + 1] = {match = match, weight = weights[member], member = member,
                           continuation = string.sub(document, 4 * pos + 1, 4 * (pos + k))}
      longest = math.max(longest, match)
    end
  end
  local alive = {}
  for _, c in ipairs(found) do
    if c.match == longest then
      alive[#alive + 1] = c
    end
  end
  return alive, longest
end

-- The next tokens of the alive candidates at depth, ranked by their summed weights, heaviest first
-- (stable: ties keep the order first seen, as Python's sorted), their weights and the total.
local function ranked_at(alive, depth)
  local seen, weight, total = {}, {}, 0
  for _, c in ipairs(alive) do
    if 4 * depth < #c.continuation then
      local token = token_at(c.continuation, depth)
      if weight[token] then
        weight[token] = weight[token] + c.weight
      else
        weight[token] = c.weight
        seen[#seen + 1] = token
      end
      total = total + c.weight
    end
  end
  local ranked = {}
  for _, token in ipairs(seen) do  -- an insertion sort: after every token at least as heavy
    local at = #ranked + 1
    while at > 1 and weight[ranked[at - 1]] < weight[token] do
      ranked[at] = ranked[at - 1]
      at = at - 1
    end
    ranked[at] = token
  end
  return ranked, weight, total
end

-- learned.walk: the heaviest continuation while the product of shares stays >= min_share, at most
-- min(k, reach * match) deep; at the first depth up to width - 1 other continuations as leaves.
local alive, match = candidates()
local tokens, parents, weights, totals, used = {}, {}, {}, {}, {}
local parent, product = -1, 1.0
local function add(token, node_parent, weight, total)
  tokens[#tokens + 1] = struct.unpack("<i4", token)
  parents[#parents + 1] = node_parent
  weights[#weights + 1] = weight
  totals[#totals + 1] = total
end
for depth = 0, math.min(k, reach * match) - 1 do
  local ranked, weight, total = ranked_at(alive, depth)
  if #ranked == 0 then
    break
  end
  local best = ranked[1]
  product = product * (weight[best] / total)  -- the same IEEE operations, in the same order, as Python
  if product < min_share then
    break
  end
  local chain_parent = parent
  add(best, chain_parent, weight[best], total)
  parent = #tokens - 1
  if depth == 0 then
    for _, c in ipairs(alive) do
      if token_at(c.continuation, 0) == best then
        used[#used + 1] = c.member
      end
    end
    for r = 2, math.min(width, #ranked) do
      add(ranked[r], chain_parent, weight[ranked[r]], total)
    end
  end
  local next_alive = {}
  for _, c in ipairs(alive) do
    if token_at(c.continuation, depth) == best then
      next_alive[#next_alive + 1] = c
    end
  end
  alive = next_alive
end
if #tokens == 0 then
  return NONE
end
local clock = redis.call("HINCRBY", state, "clock", 1)
for _, member in ipairs(used) do
  redis.call("ZADD", lru, "XX", clock, member)  -- XX: bump, never re-create
end
return {tokens, parents, weights, totals, match}
