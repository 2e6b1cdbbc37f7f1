-- concurrency: at most Rate slots held at once; each lease expires Period
-- after it was taken, so a crashed holder cannot leak a slot. Anonymous
-- leases (plain Take) get a unique id from the Go side.
--
-- One ZSET holds, per lease of weight w, the member "<lease>#<w>w" scored
-- by its expiry in µs, and for w > 1 the member "<lease>#w" scored -w, by
-- which Release finds the weight; and "#t" scored minus the slots held in
-- all (its running total). Negative scores never meet expiries. A lease of
-- weight n therefore costs one or two members, not n; held slots are read
-- from "#t", expiry removes each lease once, and Release removes a lease's
-- whole weight.
--
-- A key written by a weir before weighted leases (one member "<lease>#<i>"
-- per slot) has no "#t": the first call to find members without it counts
-- them (an old member is one slot) and writes it. An older weir that runs
-- on the same key removes the negative members; the same count restores
-- them.

local function lease_member(id, w)
  return id .. '#' .. fmt(w) .. 'w'
end

local function lease_weight_member(id)
  return id .. '#w'
end

-- lease_parse returns the id and weight of a lease member, weight 1 for a
-- member of the old one-per-slot form.
local function lease_parse(m)
  local id, w = string.match(m, '^(.*)#(%d+)w$')
  if id then
    return id, tonumber(w)
  end
  return nil, 1
end

-- lease_set_total writes the running total of held slots.
local function lease_set_total(key, total)
  if total > 0 then
    redis.call('ZADD', key, fmt(-total), '#t')
  else
    redis.call('ZREM', key, '#t')
  end
end

-- lease_zrem removes the members names[1..] from key, in commands of at
-- most 1000, skipping the member keep (if any).
local function lease_zrem(key, names, keep)
  local skip
  if keep then
    skip = { [keep] = true }
  end
  zrem_except(key, names, skip)
end

-- lease_total returns the slots held by the key's members (expired ones
-- not yet removed included). Without "#t" it counts them, one pass, and
-- rewrites the weight members: it reads them all first, and removes the
-- old negative members only when a lease stays, so that the key does not
-- empty on the way. A key that holds no lease but negative members loses
-- them (and so the key) at once, or with defer it is left as it is and
-- the second result says so (load: s.stale). The third says that the key
-- does not exist.
local function lease_total(key, defer)
  local t = redis.call('ZSCORE', key, '#t')
  if t then
    return -tonumber(t)
  end
  if redis.call('ZCARD', key) == 0 then
    return 0, false, true
  end
  local total, off, args = 0, 0, {}
  while true do
    local e = redis.call('ZRANGEBYSCORE', key, '(0', '+inf', 'LIMIT', off, 1000)
    for i = 1, #e do
      local id, w = lease_parse(e[i])
      if id and w > 1 then
        args[#args + 1] = fmt(-w)
        args[#args + 1] = lease_weight_member(id)
      end
      total = total + w
    end
    if #e < 1000 then
      break
    end
    off = off + 1000
  end
  if total == 0 and defer then
    return 0, true
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(0')
  for i = 1, #args, 1000 do
    redis.call('ZADD', key, unpack(args, i, min(i + 999, #args)))
  end
  lease_set_total(key, total)
  return total
end

-- lease_expiring returns the expiry of the first lease in expiry order
-- by which need (1 <= need <= s.total) slots have expired. It reads leases
-- from whichever end has less weight to cover: from the oldest until need
-- slots, or from the newest while at most s.total - need slots lie after
-- the lease. So a request for one slot, or for nearly all, reads few.
local function lease_expiring(s, now, need)
  local after = s.total - need -- slots that may lie after the answer
  local off, acc, ans = 0, 0, nil
  while true do
    local e
    -- Leases expire at (now, +inf): load dropped the others, or left
    -- them for the decision's end (s.stale).
    if need <= after + 1 then
      e = redis.call('ZRANGEBYSCORE', s.key, '(' .. fmt(now), '+inf', 'WITHSCORES', 'LIMIT', off, 100)
    else
      e = redis.call('ZREVRANGEBYSCORE', s.key, '+inf', '(' .. fmt(now), 'WITHSCORES', 'LIMIT', off, 100)
    end
    for i = 1, #e, 2 do
      local _, w = lease_parse(e[i])
      if need <= after + 1 then
        acc = acc + w
        if acc >= need then
          return tonumber(e[i + 1])
        end
      else
        if acc > after then
          return ans
        end
        ans = tonumber(e[i + 1])
        acc = acc + w
      end
    end
    if #e < 200 then
      return ans -- from the newest: the oldest lease; from the oldest: none
    end
    off = off + 100
  end
end

-- lease_clear finishes what load left for the decision's end (s.stale):
-- it removes the expired leases and their weights, then "#t" (which may
-- take the key with it: nothing follows on the key), or a key's negative
-- members when it holds no lease. keep, if given, is a lease just added,
-- which stays (a named lease taken again), and "#t" is left to the caller.
local function lease_clear(s, keep)
  local st = s.stale
  s.stale = nil
  if st.negs then
    redis.call('ZREMRANGEBYSCORE', s.key, '-inf', '(0')
    return
  end
  lease_zrem(s.key, st.weights)
  lease_zrem(s.key, st.leases, keep)
  if not keep then
    lease_set_total(s.key, s.total)
  end
end

ALG.concurrency = {
  -- load drops expired leases (expiry <= now), each once, with their
  -- weights, when a lease stays: "#t" keeps the key. When none stays, a
  -- write could empty the key before decide writes it again, so the
  -- expired leases stay until the decision's end (s.stale; see GUARDED in
  -- batch.lua): decide drops them after adding its lease, or last.
  load = function(s, p, now)
    local negs, fresh
    s.total, negs, fresh = lease_total(s.key, true)
    if negs then
      s.stale = { negs = true }
      return
    end
    if fresh then
      s.fresh = true -- no key: nothing expires, and decide knows its last lease
      return
    end
    local gone, leases, weights, off = 0, {}, {}, 0
    while true do
      local e = redis.call('ZRANGEBYSCORE', s.key, '(0', fmt(now), 'LIMIT', off, 1000)
      for i = 1, #e do
        local id, w = lease_parse(e[i])
        if id and w > 1 then
          weights[#weights + 1] = lease_weight_member(id)
        end
        gone = gone + w
        leases[#leases + 1] = e[i]
      end
      if #e < 1000 then
        break
      end
      off = off + 1000
    end
    if gone > 0 then
      s.total = s.total - gone
      s.stale = { leases = leases, weights = weights }
      if s.total > 0 then
        lease_clear(s) -- "#t" is rewritten, not removed: the key stays
      end
    end
  end,

  decide = function(p, s, now, cost, mode, apply)
    local d = decision(p)
    local held = min(s.total, p.rate)
    local g = grant(cost, p.rate - held, mode)
    if g == 0 then
      -- Wait for the earliest leases to expire until cost fits: the first
      -- lease (in expiry order) by which need slots have expired.
      local t = lease_expiring(s, now, held + cost - p.rate)
      if t then
        d.retry = t - now
      end
    elseif apply then
      local m = lease_member(s.id, g)
      redis.call('ZADD', s.key, fmt(now + p.period), m)
      if s.stale then
        lease_clear(s, m) -- the lease keeps the key
      end
      if g > 1 then
        redis.call('ZADD', s.key, fmt(-g), lease_weight_member(s.id))
      end
      s.total = s.total + g
      lease_set_total(s.key, s.total)
      held = held + g
      d.changed = true
    end
    d.granted, d.remaining = g, p.rate - held
    -- The last lease to expire (an expiry past now: expired leases may
    -- still be there, s.stale).
    if s.fresh then
      -- The key was missing: the lease just added, if any, is its only one.
      if d.changed then
        d.reset = p.period
      end
    else
      local e = redis.call('ZRANGE', s.key, -1, -1, 'WITHSCORES')
      if e[2] and tonumber(e[2]) > now then
        d.reset = tonumber(e[2]) - now
      end
    end
    if s.stale and not s.saving then
      lease_clear(s) -- nothing follows on the key: this may delete it
    end
    return d
  end,

  save = function(s, pttl)
    redis.call('PEXPIRE', s.key, pttl) -- decide wrote the members
  end,

  -- refund: release exactly the lease the take added. (multi.lua's refund
  -- only: the store refuses a concurrency debt, so a batch never settles
  -- one.)
  refund = function(p, s, take_now, now, g)
    if s.stale then
      lease_clear(s) -- as load did before GUARDED
    end
    if redis.call('ZREM', s.key, lease_member(s.id, g)) == 0 then
      return false
    end
    if g > 1 then
      redis.call('ZREM', s.key, lease_weight_member(s.id))
    end
    s.total = s.total - g
    lease_set_total(s.key, s.total)
    return true
  end,
}
