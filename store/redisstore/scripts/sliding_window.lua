-- sliding_window: Cloudflare's two-counter approximation. The previous
-- window's count is weighted by the part of it still inside the sliding
-- window, in ticks of Tick µs: estimate = ceil(prev * (P - e) / P) + cur.
-- State: a hash {w, cur, prev} with PEXPIRE when both counts are forgotten.

ALG.sliding_window = {
  load = function(s, p, now)
    s.window, s.count, s.prev = 0, 0, 0
    local v = redis.call('HMGET', s.key, 'w', 'cur', 'prev')
    if v[1] then
      s.window, s.count, s.prev = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
    end
  end,

  decide = function(p, s, now, cost, mode, apply)
    local d = decision(p)
    local pt = idiv(p.period, p.tick) -- the period in ticks (Tick divides it)
    local nt = idiv(now, p.tick) -- now in ticks
    local w = idiv(nt, pt) -- the current window
    local e = nt - w * pt -- ticks elapsed in it
    local cur, prev = 0, 0
    if s.window == w then
      cur, prev = s.count, s.prev
    elseif s.window == w - 1 then
      prev = s.count -- the stored window is now the previous one
    end
    cur, prev = min(cur, p.rate), min(prev, p.rate)
    -- prev*(pt-e) <= Rate*pt < 2^53: Compile chose Tick to make it so.
    local weighted = ceil_div(prev * (pt - e), pt)
    local est = weighted + cur
    local g = grant(cost, max(p.rate - est, 0), mode)
    if g == 0 then
      local at -- the instant, in ticks, when the request fits
      local k = p.rate - cur - cost
      if k >= 0 then
        -- Same window: ceil(prev(P-e')/P) <= k  <=>  e' >= P - floor(kP/prev).
        at = w * pt + pt - idiv(k * pt, prev)
      else
        -- Next window, where the current count becomes prev.
        local need = 0
        if cur > 0 then
          need = max(pt - idiv((p.rate - cost) * pt, cur), 0)
        end
        at = (w + 1) * pt + need
      end
      d.retry = at * p.tick - now
    elseif apply then
      cur = cur + g
      est = est + g
      s.window, s.count, s.prev = w, cur, prev
      d.changed = true
    end
    d.granted, d.remaining = g, max(p.rate - est, 0)
    if cur > 0 then
      d.reset = (w + 2) * pt * p.tick - now -- cur weighs nothing two windows on
    elseif prev > 0 then
      d.reset = (w + 1) * pt * p.tick - now
    end
    d.allowed = d.granted > 0
    return d
  end,

  save = function(s, ttl)
    if ttl <= 0 then
      redis.call('DEL', s.key)
      return
    end
    redis.call('HSET', s.key, 'w', fmt(s.window), 'cur', fmt(s.count), 'prev', fmt(s.prev))
    redis.call('PEXPIRE', s.key, ms(ttl))
  end,

  -- refund: take the g events out of the counter that holds them now: cur
  -- if the take's window is still the stored one, prev if the stored window
  -- is the next one (its take moved the count into prev).
  refund = function(p, s, take_now, now, g)
    local tw = idiv(idiv(take_now, p.tick), idiv(p.period, p.tick))
    if s.window == tw and s.count > 0 then
      s.count = max(s.count - g, 0)
      return true
    elseif s.window == tw + 1 and s.prev > 0 then
      s.prev = max(s.prev - g, 0)
      return true
    end
    return false
  end,
}
