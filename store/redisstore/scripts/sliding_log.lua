-- sliding_log: a ZSET of one member per admitting call, scored by its µs
-- timestamp: "<end>:<w>:<id>", where w is the events the call admitted,
-- end the running count of events up to and including it (16 digits, so
-- that members of one timestamp sort in the order they came), and id the
-- take's unique id (made by the Go side; a refund finds its member by it).
-- The events a key holds are end(newest) - (end(oldest) - w(oldest)), and
-- the i-th oldest event lies in the first member whose end passes it: a
-- binary search. A call of cost n costs one member, not n; memory is one
-- member per admitting call still inside the window.
--
-- The log stays ascending: a member is scored at the later of now and the
-- newest member's timestamp (algorithm.Log does the same), so a clock that
-- steps back never reorders it.
--
-- A key written by a weir before weighted members (one member "<id>#<i>"
-- per event) is rewritten in this form the first time a call finds such a
-- member at either end of its log, each old member counting one event.

local function log_member(cum, w, id)
  return string.format('%016d:%d:%s', cum, w, id)
end

-- log_parse returns a member's end, weight and id, or nil for a member of
-- the old one-per-event form.
local function log_parse(m)
  local c, w, id = string.match(m, '^(%d+):(%d+):(.*)$')
  if c then
    return tonumber(c), tonumber(w), id
  end
  return nil
end

-- log_rebuild rewrites the members from rank `from` on: old members count
-- one event each, and consecutive old members of one timestamp (one old
-- take) become one member; every end is recomputed. Each old member is
-- rewritten once.
local function log_rebuild(key, from)
  local prev = 0
  if from > 0 then
    prev = log_parse(redis.call('ZRANGE', key, from - 1, from - 1)[1])
  end
  local ts, ws, ids, old = {}, {}, {}, {}
  local r = from
  while true do
    local e = redis.call('ZRANGE', key, r, r + 999, 'WITHSCORES')
    for i = 1, #e, 2 do
      local _, w, id = log_parse(e[i])
      local t = tonumber(e[i + 1])
      local n = #ts
      if w == nil and n > 0 and old[n] and ts[n] == t then
        ws[n] = ws[n] + 1
      else
        ts[n + 1], ws[n + 1], ids[n + 1], old[n + 1] = t, w or 1, id or '', w == nil
      end
    end
    if #e < 2000 then
      break
    end
    r = r + 1000
  end
  redis.call('ZREMRANGEBYRANK', key, from, -1)
  local args = {}
  for i = 1, #ts do
    prev = prev + ws[i]
    args[#args + 1] = fmt(ts[i])
    args[#args + 1] = log_member(prev, ws[i], ids[i])
    if #args >= 1000 or i == #ts then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
end

-- LOG_HEAD is how many of the oldest members load reads at once: in most
-- keys the whole log.
local LOG_HEAD = 4

-- log_state reads the oldest and newest members into s: size (members),
-- base (the running count before the oldest), last_end, last_ts and total
-- (events). It first rewrites old-form members found at either end. head,
-- if given, is what ZRANGE 0 LOG_HEAD-1 WITHSCORES returns now (load has
-- read it): the whole log when it holds fewer than LOG_HEAD members, and
-- the newest member when it holds LOG_HEAD.
local function log_state(s, head)
  s.size, s.base, s.last_end, s.last_ts, s.total = 0, 0, 0, 0, 0
  for _ = 1, 2 do
    if head and #head < 2 * LOG_HEAD then
      s.size = #head / 2
    else
      s.size = redis.call('ZCARD', s.key)
    end
    if s.size == 0 then
      return
    end
    local f, b = head, nil
    if not head then
      f = redis.call('ZRANGE', s.key, 0, 0)
    end
    if head and s.size <= LOG_HEAD then
      b = { head[2 * s.size - 1], head[2 * s.size] }
    else
      b = redis.call('ZRANGE', s.key, -1, -1, 'WITHSCORES')
    end
    head = nil -- a rewrite below changes the log: read it again
    local fc, fw = log_parse(f[1])
    local bc = log_parse(b[1])
    if fc and bc and bc < 2 ^ 50 then
      s.base, s.last_end, s.last_ts = fc - fw, bc, tonumber(b[2])
      s.total = s.last_end - s.base
      return
    end
    if not fc or bc then
      -- Old members at the oldest end, or running counts grown past 2^50
      -- (a key that never went idle): rewrite from zero.
      log_rebuild(s.key, 0)
    else
      -- Old members at the newest end only (an older weir wrote there):
      -- rewrite from the newest member in the new form on.
      local r = s.size - 1
      while r > 0 and not log_parse(redis.call('ZRANGE', s.key, r - 1, r - 1)[1]) do
        r = r - 1
      end
      log_rebuild(s.key, r)
    end
  end
end

-- log_event_ts returns the timestamp of the j-th oldest event (0-based).
local function log_event_ts(s, j)
  local lo, hi = 0, s.size - 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local c = log_parse(redis.call('ZRANGE', s.key, mid, mid)[1])
    if c == nil then
      -- An old-form member inside the log: rewrite it all, search again.
      log_rebuild(s.key, 0)
      log_state(s)
      lo, hi = 0, s.size - 1
    elseif c - s.base > j then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return tonumber(redis.call('ZRANGE', s.key, lo, lo, 'WITHSCORES')[2])
end

-- log_drop_oldest drops the k oldest events: whole members, then part of
-- the oldest one.
local function log_drop_oldest(s, k)
  while k > 0 and s.size > 0 do
    local e = redis.call('ZRANGE', s.key, 0, 0, 'WITHSCORES')
    local c, w, id = log_parse(e[1])
    redis.call('ZREM', s.key, e[1])
    if w <= k then
      s.size = s.size - 1
      s.base = c
      k = k - w
    else
      redis.call('ZADD', s.key, e[2], log_member(c, w - k, id))
      s.base = s.base + k
      k = 0
    end
  end
  s.total = s.last_end - s.base
end

ALG.sliding_log = {
  load = function(s, p, now)
    local head = redis.call('ZRANGE', s.key, 0, LOG_HEAD - 1, 'WITHSCORES')
    if head[1] and tonumber(head[2]) <= now - p.period then
      -- Drop entries that left the window (ts + Period <= now), if the
      -- oldest has; one member was the whole log.
      redis.call('ZREMRANGEBYSCORE', s.key, '-inf', fmt(now - p.period))
      if #head == 2 then
        head = {}
      else
        head = nil
      end
    end
    log_state(s, head)
  end,

  decide = function(p, s, now, cost, mode, apply)
    local d = decision(p)
    -- Every event counts: beyond Rate only after a lowered limit or a
    -- debit (debt), which then waits for the oldest to leave.
    local count = s.total
    local g = grant(cost, p.rate - count, mode)
    if g == 0 then
      -- The (count+cost-Rate)-th oldest event must leave the window.
      local k = count + cost - p.rate
      d.retry = log_event_ts(s, k - 1) + p.period - now
    elseif apply then
      local t = max(now, s.last_ts)
      s.last_end = s.last_end + g
      redis.call('ZADD', s.key, fmt(t), log_member(s.last_end, g, s.id))
      s.size, s.last_ts, s.total = s.size + 1, t, s.total + g
      if s.total > p.rate then
        -- Like algorithm.Log: keep the newest Rate events.
        log_drop_oldest(s, s.total - p.rate)
      end
      count = count + g
      d.changed = true
    end
    d.granted, d.remaining = g, max(p.rate - count, 0)
    if s.size > 0 then
      -- The newest entry leaves last.
      d.reset = s.last_ts + p.period - now
    end
    return d
  end,

  save = function(s, pttl)
    redis.call('PEXPIRE', s.key, pttl) -- decide wrote the members
  end,

  -- refund: remove the member the take added (what is left of it, if the
  -- log has since dropped its oldest events), and move the ends of the
  -- members added after it back by its weight.
  refund = function(p, s, take_now, now, g)
    local e = redis.call('ZRANGEBYSCORE', s.key, fmt(take_now), '+inf', 'WITHSCORES')
    local w = nil
    for i = 1, #e, 2 do
      local c, mw, id = log_parse(e[i])
      if w then
        if c then
          redis.call('ZREM', s.key, e[i])
          redis.call('ZADD', s.key, e[i + 1], log_member(c - w, mw, id))
        end
      elseif id == s.id then
        redis.call('ZREM', s.key, e[i])
        w = mw
      end
    end
    log_state(s)
    return w ~= nil
  end,

  -- settle: a settlement's refund (algorithm.Log.removeAt): up to g events
  -- of the members at exactly take_now (one Go entry), and the ends of the
  -- members after them moved back by what was removed.
  settle = function(p, s, take_now, now, g)
    local e = redis.call('ZRANGEBYSCORE', s.key, fmt(take_now), '+inf', 'WITHSCORES')
    local off = 0
    for i = 1, #e, 2 do
      local c, w, id = log_parse(e[i])
      if c then
        local k = 0
        if tonumber(e[i + 1]) == take_now then
          k = min(g - off, w)
        end
        if k > 0 or off > 0 then
          redis.call('ZREM', s.key, e[i])
          if w > k then
            redis.call('ZADD', s.key, e[i + 1], log_member(c - off - k, w - k, id))
          end
          off = off + k
        end
      end
    end
    log_state(s)
    return off > 0
  end,

  -- debit: add n events at now, past the rate if need be (debt), keeping
  -- at most 2*Rate, the oldest dropped first (slidingLogDebit).
  debit = function(p, s, now, n)
    local cap = 2 * p.rate
    local g = min(n, cap)
    local t = max(now, s.last_ts)
    s.last_end = s.last_end + g
    redis.call('ZADD', s.key, fmt(t), log_member(s.last_end, g, s.id))
    s.size, s.last_ts, s.total = s.size + 1, t, s.total + g
    if s.total > cap then
      log_drop_oldest(s, s.total - cap)
    end
  end,

  -- credit: take back up to n of the newest events (slidingLogCredit).
  credit = function(p, s, now, n)
    local k = n
    while k > 0 and s.size > 0 do
      local e = redis.call('ZRANGE', s.key, -1, -1, 'WITHSCORES')
      local c, w, id = log_parse(e[1])
      if c == nil then
        log_rebuild(s.key, 0) -- an old-form member: rewrite, then go on
        log_state(s)
      else
        redis.call('ZREM', s.key, e[1])
        if w <= k then
          s.size, k, s.last_end = s.size - 1, k - w, c - w
        else
          redis.call('ZADD', s.key, e[2], log_member(c - k, w - k, id))
          s.last_end, k = c - k, 0
        end
      end
    end
    s.last_ts, s.total = 0, 0
    if s.size > 0 then
      s.last_ts = tonumber(redis.call('ZRANGE', s.key, -1, -1, 'WITHSCORES')[2])
      s.total = s.last_end - s.base
    end
  end,
}
