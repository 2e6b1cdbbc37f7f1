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
-- rewritten once. It reads them all, then adds the new members before it
-- removes the old ones that are not among them, so the key never empties
-- on the way (see GUARDED in batch.lua).
local function log_rebuild(key, from)
  local prev = 0
  if from > 0 then
    prev = log_parse(redis.call('ZRANGE', key, from - 1, from - 1)[1])
  end
  local ts, ws, ids, old, names = {}, {}, {}, {}, {}
  local r = from
  while true do
    local e = redis.call('ZRANGE', key, r, r + 999, 'WITHSCORES')
    for i = 1, #e, 2 do
      names[#names + 1] = e[i]
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
  local args, added = {}, {}
  for i = 1, #ts do
    prev = prev + ws[i]
    local m = log_member(prev, ws[i], ids[i])
    added[m] = true
    args[#args + 1] = fmt(ts[i])
    args[#args + 1] = m
    if #args >= 1000 or i == #ts then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  zrem_except(key, names, added)
end

-- LOG_HEAD is how many of the oldest members load reads at once: in most
-- keys the whole log.
local LOG_HEAD = 4

-- log_state reads the oldest and newest members into s: size (members),
-- base (the running count before the oldest), last_end, last_ts and total
-- (events). It first rewrites old-form members found at either end. head,
-- if given, is what ZRANGE 0 LOG_HEAD-1 WITHSCORES returns now (load has
-- read it): the whole log when it holds fewer than LOG_HEAD members, and
-- the newest member when it holds LOG_HEAD. last, if given, is what ZRANGE
-- -1 -1 WITHSCORES returns now.
local function log_state(s, head, last)
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
    local f, b = head, last
    if not head then
      f = redis.call('ZRANGE', s.key, 0, 0)
    end
    if b then
      -- load read it
    elseif head and s.size <= LOG_HEAD then
      b = { head[2 * s.size - 1], head[2 * s.size] }
    else
      b = redis.call('ZRANGE', s.key, -1, -1, 'WITHSCORES')
    end
    head, last = nil, nil -- a rewrite below changes the log: read it again
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
  if s.size == 0 then
    return nil -- no event (a cost past the limit, which the store refuses)
  end
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
-- the oldest one (its remainder added before the member goes). It never
-- reaches the newest member, which its callers have just added.
local function log_drop_oldest(s, k)
  while k > 0 and s.size > 0 do
    local e = redis.call('ZRANGE', s.key, 0, 0, 'WITHSCORES')
    local c, w, id = log_parse(e[1])
    if w <= k then
      redis.call('ZREM', s.key, e[1])
      s.size = s.size - 1
      s.base = c
      k = k - w
    else
      redis.call('ZADD', s.key, e[2], log_member(c, w - k, id))
      redis.call('ZREM', s.key, e[1])
      s.base = s.base + k
      k = 0
    end
  end
  s.total = s.last_end - s.base
end

-- log_clear drops the members of a log whose every member has left the
-- window (s.stale, see load), and with them the key.
local function log_clear(s)
  redis.call('ZREMRANGEBYSCORE', s.key, '-inf', s.stale)
  s.stale = nil
end

-- log_add adds g events at now (the newest member's timestamp if later)
-- as one member, then drops what load left of a log that had wholly left
-- the window (which cannot take the key now), then the oldest events past
-- cap.
local function log_add(s, now, g, cap)
  local t = max(now, s.last_ts)
  s.last_end = s.last_end + g
  redis.call('ZADD', s.key, fmt(t), log_member(s.last_end, g, s.id))
  s.size, s.last_ts, s.total = s.size + 1, t, s.total + g
  if s.stale then
    log_clear(s)
  end
  if s.total > cap then
    log_drop_oldest(s, s.total - cap)
  end
end

ALG.sliding_log = {
  -- load sends no write that could empty the key (see GUARDED in
  -- batch.lua): it drops entries that left the window (ts + Period <= now)
  -- only if the newest stays. When every entry has left, the log is empty
  -- but its members stay until the decision's end (s.stale): log_add drops
  -- them after its member is in, and otherwise decide drops them, and the
  -- key, as its last command (save deletes the key instead when one
  -- follows, s.saving: a debit's, refund's or settlement's).
  load = function(s, p, now)
    local head = redis.call('ZRANGE', s.key, 0, LOG_HEAD - 1, 'WITHSCORES')
    local cut = now - p.period
    local last = nil
    if head[1] and tonumber(head[2]) <= cut then
      -- The oldest has left; has the newest?
      if #head < 2 * LOG_HEAD then
        last = { head[#head - 1], head[#head] }
      else
        last = redis.call('ZRANGE', s.key, -1, -1, 'WITHSCORES')
      end
      if tonumber(last[2]) <= cut then
        s.size, s.base, s.last_end, s.last_ts, s.total = 0, 0, 0, 0, 0
        s.stale = fmt(cut)
        return
      end
      redis.call('ZREMRANGEBYSCORE', s.key, '-inf', fmt(cut))
      if #head < 2 * LOG_HEAD then
        -- head held the whole log: what is left of it is the log now.
        local live = {}
        for i = 1, #head, 2 do
          if tonumber(head[i + 1]) > cut then
            live[#live + 1], live[#live + 2] = head[i], head[i + 1]
          end
        end
        head = live
      else
        head = nil
      end
    end
    log_state(s, head, last)
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
      -- Like algorithm.Log: keep the newest Rate events.
      log_add(s, now, g, p.rate)
      count = count + g
      d.changed = true
    end
    d.granted, d.remaining = g, max(p.rate - count, 0)
    if s.size > 0 then
      -- The newest entry leaves last.
      d.reset = s.last_ts + p.period - now
    end
    if s.stale and not s.saving then
      log_clear(s) -- nothing follows on the key: this may delete it
    end
    return d
  end,

  -- save: decide wrote the members. A log that a credit or settlement
  -- emptied, or that had wholly left the window, still holds its last
  -- members (credit, settle, load): the key goes.
  save = function(s, pttl)
    if s.size == 0 then
      redis.call('DEL', s.key)
    else
      redis.call('PEXPIRE', s.key, pttl)
    end
  end,

  -- refund: remove the member the take added (what is left of it, if the
  -- log has since dropped its oldest events), and move the ends of the
  -- members added after it back by its weight. (multi.lua's refund only;
  -- a batch refunds with credit or settle.)
  refund = function(p, s, take_now, now, g)
    if s.stale then
      log_clear(s) -- as load did before GUARDED
    end
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
  -- members after them moved back by what was removed. A member's
  -- replacement goes in before it goes out, and the log's last member, if
  -- it goes, stays for save's DEL: the key never empties on the way.
  settle = function(p, s, take_now, now, g)
    if s.stale then
      return false -- every member left the window before take_now did
    end
    local e = redis.call('ZRANGEBYSCORE', s.key, fmt(take_now), '+inf', 'WITHSCORES')
    local off, left = 0, s.size
    for i = 1, #e, 2 do
      local c, w, id = log_parse(e[i])
      if c then
        local k = 0
        if tonumber(e[i + 1]) == take_now then
          k = min(g - off, w)
        end
        if k > 0 or off > 0 then
          if w > k then
            redis.call('ZADD', s.key, e[i + 1], log_member(c - off - k, w - k, id))
            redis.call('ZREM', s.key, e[i])
          else
            if left > 1 then
              redis.call('ZREM', s.key, e[i])
            end
            left = left - 1
          end
          off = off + k
        end
      end
    end
    if off == 0 then
      return false -- nothing changed: s stands
    end
    if left == 0 then
      s.size, s.base, s.last_end, s.last_ts, s.total = 0, 0, 0, 0, 0
    else
      log_state(s)
    end
    return true
  end,

  -- debit: add n events at now, past the rate if need be (debt), keeping
  -- at most 2*Rate, the oldest dropped first (slidingLogDebit).
  debit = function(p, s, now, n)
    local cap = 2 * p.rate
    log_add(s, now, min(n, cap), cap)
  end,

  -- credit: take back up to n of the newest events (slidingLogCredit). A
  -- member's remainder goes in before it goes out, and the log's last
  -- member, if it goes, stays for save's DEL: the key never empties on
  -- the way.
  credit = function(p, s, now, n)
    local k = n
    while k > 0 and s.size > 0 do
      local e = redis.call('ZRANGE', s.key, -1, -1, 'WITHSCORES')
      local c, w, id = log_parse(e[1])
      if c == nil then
        log_rebuild(s.key, 0) -- an old-form member: rewrite, then go on
        log_state(s)
      elseif w <= k then
        if s.size > 1 then
          redis.call('ZREM', s.key, e[1])
        end
        s.size, k, s.last_end = s.size - 1, k - w, c - w
      else
        redis.call('ZADD', s.key, e[2], log_member(c - k, w - k, id))
        redis.call('ZREM', s.key, e[1])
        s.last_end, k = c - k, 0
      end
    end
    s.last_ts, s.total = 0, 0
    if s.size > 0 then
      s.last_ts = tonumber(redis.call('ZRANGE', s.key, -1, -1, 'WITHSCORES')[2])
      s.total = s.last_end - s.base
    end
  end,
}
