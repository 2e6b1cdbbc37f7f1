-- sliding_log: one ZSET member per admitted event, scored by its µs
-- timestamp. Members are "<id>#<i>" for the i-th event of one take, where id
-- is unique per take (made by the Go side), so equal timestamps never merge.
-- Exact; memory is one member per event still inside the window.

ALG.sliding_log = {
  load = function(s, p, now)
    -- Drop entries that left the window: ts + Period <= now.
    redis.call('ZREMRANGEBYSCORE', s.key, '-inf', fmt(now - p.period))
    s.size = redis.call('ZCARD', s.key)
  end,

  decide = function(p, s, now, cost, mode, apply)
    local d = decision(p)
    local count = min(s.size, p.rate)
    local g = grant(cost, p.rate - count, mode)
    if g == 0 then
      -- The (count+cost-Rate)-th oldest counted entry must leave the window;
      -- entries beyond Rate (after a lowered limit) are the oldest ones.
      local k = count + cost - p.rate
      local idx = s.size - count + k - 1
      local e = redis.call('ZRANGE', s.key, idx, idx, 'WITHSCORES')
      d.retry = tonumber(e[2]) + p.period - now
    elseif apply then
      add_members(s.key, fmt(now), s.id, 1, g)
      s.size = s.size + g
      if s.size > p.rate then
        -- Like the Go ring buffer at capacity: keep the newest Rate entries.
        redis.call('ZREMRANGEBYRANK', s.key, 0, s.size - p.rate - 1)
        s.size = p.rate
      end
      count = count + g
      d.changed = true
    end
    d.granted, d.remaining = g, p.rate - count
    if s.size > 0 then
      -- The newest entry leaves last.
      local e = redis.call('ZRANGE', s.key, -1, -1, 'WITHSCORES')
      d.reset = tonumber(e[2]) + p.period - now
    end
    d.allowed = d.granted > 0
    return d
  end,

  save = function(s, ttl)
    if ttl <= 0 then
      redis.call('DEL', s.key)
      return
    end
    redis.call('PEXPIRE', s.key, ms(ttl))
  end,

  -- refund: remove exactly the members the take added.
  refund = function(p, s, take_now, now, g)
    remove_members(s.key, s.id, g)
    s.size = redis.call('ZCARD', s.key)
    return true
  end,
}
