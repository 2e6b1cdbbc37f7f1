-- sliding_window: Cloudflare's two-counter approximation. The previous
-- window's count is weighted by the part of it still inside the sliding
-- window, in ticks of Tick µs: estimate = ceil(prev * (P - e) / P) + cur.
-- State: a hash {w, cur, prev} with PEXPIRE when both counts are forgotten,
-- and in debt d, the rate the debt is paid back at (algorithm.carryRate).
--
-- With buckets (p.buckets > 0) it mirrors algorithm.slidingBuckets: the
-- period is split into p.buckets buckets, the estimate weighs only the
-- oldest, and the state is {w, b}: w the newest bucket written, b the
-- counts of buckets w-n .. w as a ring, "c0,c1,...,cn", bucket i's count
-- at position i mod (n+1). It also writes cur and prev as 0, so that the
-- plain window finds no count of its own in a bucketed state.

-- sw_count mirrors slidingBuckets' count: bucket i's count, capped at the
-- rate (a lowered limit), or 0 if the ring does not hold it.
local function sw_count(p, s, valid, i)
  if not valid or i > s.window or i < 0 then
    return 0
  end
  local c = s.b[imod(i, p.buckets + 1) + 1]
  if not s.debt then
    c = min(c, p.rate) -- in debt a bucket counts in full
  end
  return c
end

-- ring_over mirrors ringOver: a bucket counts more than the rate.
local function ring_over(p, b)
  for j = 1, #b do
    if b[j] > p.rate then
      return true
    end
  end
  return false
end

-- sw_buckets mirrors algorithm.slidingBuckets step for step.
local function sw_buckets(p, s, now, cost, mode, apply)
  local d = decision(p)
  local nb = p.buckets
  local ring = nb + 1
  local bt = idiv(idiv(p.period, p.tick), nb) -- a bucket, in ticks (Compile made it whole)
  local nt = idiv(now, p.tick)
  local w = idiv(nt, bt)
  local e = nt - w * bt
  -- The ring holds buckets window-nb .. window; a state written under
  -- another bucket count, or in the future, or too long ago, is empty.
  local valid = #s.b == ring and s.window <= w and w - s.window <= nb
  local old = sw_count(p, s, valid, w - nb)
  local held = 0 -- buckets w-nb+1 .. w, wholly inside the trailing period
  for i = w - nb + 1, w do
    held = held + sw_count(p, s, valid, i)
  end
  -- old*(bt-e) <= Rate*bt <= Rate*Period/Tick < 2^53: Compile chose Tick.
  local est = ceil_div(old * (bt - e), bt) + held
  local g = grant(cost, max(p.rate - est, 0), mode)
  if g == 0 then
    -- In bucket w+m the estimate is ceil(c[w+m-nb](bt-e')/bt) + rest; the
    -- request fits in the first bucket where k = Rate - cost - rest >= 0.
    local rest = held
    for m = 0, nb do
      local o = sw_count(p, s, valid, w + m - nb)
      if m > 0 then
        rest = rest - o
      end
      local k = p.rate - cost - rest
      if k >= 0 then
        local at = (w + m) * bt -- in ticks
        if o > 0 then
          at = at + bt - idiv(k * bt, o)
        end
        d.retry = at * p.tick - now
        break
      end
    end
  elseif apply then
    if #s.b ~= ring then
      s.b = {}
      for j = 1, ring do
        s.b[j] = 0
      end
    end
    -- Rewrite the ring as buckets w-nb .. w: each index has its own slot.
    for i = max(w - nb, 0), w do
      s.b[imod(i, ring) + 1] = sw_count(p, s, valid, i)
    end
    local j = imod(w, ring) + 1
    s.b[j] = s.b[j] + g
    set_debt(p, s, s.debt and ring_over(p, s.b))
    s.window, s.count, s.prev = w, 0, 0
    valid = true
    est = est + g
    d.changed = true
  end
  d.granted, d.remaining = g, max(p.rate - est, 0)
  -- The newest bucket with a count leaves the trailing period nb+1
  -- buckets after it began.
  for i = w, w - nb, -1 do
    if sw_count(p, s, valid, i) > 0 then
      d.reset = (i + nb + 1) * bt * p.tick - now
      break
    end
  end
  return d
end

-- sw_counts mirrors swCounts: the current and previous windows' counts in
-- window w, capped at the rate; in debt the current count is not capped,
-- and what is over the rate carries into the next windows, paid back at
-- carry_rate per window.
local function sw_counts(p, s, w)
  local cur, prev = 0, 0
  local k = w - s.window
  if k == 0 then
    cur, prev = s.count, s.prev
  elseif k == 1 and not s.debt then
    prev = s.count -- the stored window is now the previous one
  elseif k >= 1 and s.debt and k - 1 <= idiv(s.count, carry_rate(p, s)) then
    local r = carry_rate(p, s)
    prev = s.count - (k - 1) * r
    cur = max(prev - r, 0)
  end
  if not s.debt then
    cur = min(cur, p.rate)
  end
  return cur, min(prev, p.rate)
end

-- sw_retry mirrors swRetry: the tick at which a request of cost fits, the
-- current count paying back r per window.
local function sw_retry(p, w, pt, cur, prev, cost, r)
  local k = p.rate - cur - cost
  if k >= 0 then
    -- Same window: ceil(prev(P-e')/P) <= k  <=>  e' >= P - floor(kP/prev).
    return w * pt + pt - idiv(k * pt, prev)
  end
  local m = ceil_div(cur + cost - p.rate, r)
  local cur_m = max(cur - m * r, 0)
  local prev_m = min(cur - (m - 1) * r, p.rate)
  k = p.rate - cur_m - cost
  return (w + m) * pt + max(pt - idiv(k * pt, prev_m), 0)
end

-- sw_ring mirrors bucketRing: the ring rewritten as buckets w-nb .. w, as
-- an admitted take rewrites it; it returns w.
local function sw_ring(p, s, now)
  local nb = p.buckets
  local ring = nb + 1
  local w = idiv(idiv(now, p.tick), idiv(idiv(p.period, p.tick), nb))
  local valid = #s.b == ring and s.window <= w and w - s.window <= nb
  if #s.b ~= ring then
    s.b = {}
    for j = 1, ring do
      s.b[j] = 0
    end
  end
  for i = max(w - nb, 0), w do
    s.b[imod(i, ring) + 1] = sw_count(p, s, valid, i)
  end
  s.window, s.count, s.prev = w, 0, 0
  return w
end

ALG.sliding_window = {
  load = function(s, p, now)
    s.window, s.count, s.prev = 0, 0, 0
    if p.buckets > 0 then
      s.bucketed, s.b = true, {}
      local v = redis.call('HMGET', s.key, 'w', 'b', 'd')
      s.debt, s.drate = v[3] ~= false, tonumber(v[3]) or 0
      s.had_debt = s.debt
      if v[1] and v[2] then
        s.window = tonumber(v[1])
        for c in string.gmatch(v[2], '%d+') do
          s.b[#s.b + 1] = tonumber(c)
        end
      end
      return
    end
    local v = redis.call('HMGET', s.key, 'w', 'cur', 'prev', 'd')
    if v[1] then
      s.window, s.count, s.prev = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
    end
    -- 'd' is the debt's rate ('1' from a version that kept none).
    s.debt, s.drate = v[4] ~= false, tonumber(v[4]) or 0
    s.had_debt = s.debt
  end,

  decide = function(p, s, now, cost, mode, apply)
    if p.buckets > 0 then
      return sw_buckets(p, s, now, cost, mode, apply)
    end
    local d = decision(p)
    local pt = idiv(p.period, p.tick) -- the period in ticks (Tick divides it)
    local nt = idiv(now, p.tick) -- now in ticks
    local w = idiv(nt, pt) -- the current window
    local e = nt - w * pt -- ticks elapsed in it
    local cur, prev = sw_counts(p, s, w)
    local r = carry_rate(p, s) -- what a count over the rate pays back per window
    -- prev*(pt-e) <= Rate*pt < 2^53: Compile chose Tick to make it so.
    local weighted = ceil_div(prev * (pt - e), pt)
    local est = weighted + cur
    local g = grant(cost, max(p.rate - est, 0), mode)
    if g == 0 then
      d.retry = sw_retry(p, w, pt, cur, prev, cost, r) * p.tick - now
    elseif apply then
      cur = cur + g
      est = est + g
      s.window, s.count, s.prev = w, cur, prev
      set_debt(p, s, false)
      d.changed = true
    end
    d.granted, d.remaining = g, max(p.rate - est, 0)
    if cur > 0 then
      -- cur weighs nothing two windows on; in debt it carries on for
      -- ceil(cur/r) windows first.
      d.reset = (w + 1 + ceil_div(cur, r)) * pt * p.tick - now
    elseif prev > 0 then
      d.reset = (w + 1) * pt * p.tick - now
    end
    return d
  end,

  save = function(s, pttl)
    if s.bucketed then
      local b = {}
      for j = 1, #s.b do
        b[j] = fmt(s.b[j])
      end
      set_hash(s.key, pttl, 'w', fmt(s.window), 'cur', '0', 'prev', '0', 'b', table.concat(b, ','))
      set_debt_field(s)
      return
    end
    set_hash(s.key, pttl, 'w', fmt(s.window), 'cur', fmt(s.count), 'prev', fmt(s.prev))
    set_debt_field(s)
  end,

  -- refund: take the g events out of the counter that holds them now: cur
  -- if the take's window is still the stored one, prev if the stored window
  -- is the next one (its take moved the count into prev).
  refund = function(p, s, take_now, now, g)
    if p.buckets > 0 then
      -- The take's bucket, if the ring still holds it.
      local tb = idiv(idiv(take_now, p.tick), idiv(idiv(p.period, p.tick), p.buckets))
      if #s.b == p.buckets + 1 and tb <= s.window and tb >= s.window - p.buckets and tb >= 0 then
        local j = imod(tb, p.buckets + 1) + 1
        if s.b[j] > 0 then
          s.b[j] = max(s.b[j] - g, 0)
          return true
        end
      end
      return false
    end
    local tw = idiv(idiv(take_now, p.tick), idiv(p.period, p.tick))
    if s.window == tw and s.count > 0 then
      s.count = max(s.count - g, 0)
      if s.count <= p.rate then
        set_debt(p, s, false)
      end
      return true
    elseif s.window == tw + 1 and s.prev > 0 then
      s.prev = max(s.prev - g, 0)
      return true
    end
    return false
  end,

  -- debit: count n more in the current window, past the rate if need be
  -- (debt), up to debt_cap_events (slidingWindowDebit). Without buckets.
  debit = function(p, s, now, n)
    if p.buckets > 0 then
      -- bucketsDebit: the newest bucket, the ring at most 2*Rate events.
      local w = sw_ring(p, s, now)
      local total = 0
      for j = 1, #s.b do
        total = total + s.b[j]
      end
      local j = imod(w, p.buckets + 1) + 1
      s.b[j] = s.b[j] + min(n, max(2 * p.rate - total, 0))
      set_debt(p, s, ring_over(p, s.b))
      return
    end
    local w = idiv(idiv(now, p.tick), idiv(p.period, p.tick))
    local cur, prev = sw_counts(p, s, w)
    cur = add_capped(cur, n, 1, debt_cap_events(p))
    s.window, s.count, s.prev = w, cur, prev
    set_debt(p, s, cur > p.rate)
  end,

  -- credit: count n fewer, first in the current window, then in the
  -- previous one, floored at 0 (slidingWindowCredit).
  credit = function(p, s, now, n)
    if p.buckets > 0 then
      -- bucketsCredit: the newest buckets first.
      local w = sw_ring(p, s, now)
      local ring = p.buckets + 1
      local i = w
      while i >= max(w - p.buckets, 0) and n > 0 do
        local j = imod(i, ring) + 1
        local t = min(n, s.b[j])
        s.b[j] = s.b[j] - t
        n = n - t
        i = i - 1
      end
      set_debt(p, s, ring_over(p, s.b))
      return
    end
    local w = idiv(idiv(now, p.tick), idiv(p.period, p.tick))
    local cur, prev = sw_counts(p, s, w)
    local from = min(n, cur)
    cur = cur - from
    prev = max(prev - (n - from), 0)
    s.window, s.count, s.prev = w, cur, prev
    set_debt(p, s, cur > p.rate)
  end,
}
