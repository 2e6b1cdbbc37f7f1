-- concurrency: at most Rate slots held at once; each lease expires Period
-- after it was taken, so a crashed holder cannot leak a slot. A lease of
-- weight n is n ZSET members "<lease>#1".."<lease>#n" scored by its expiry
-- in µs; anonymous leases (plain Take) get a unique id from the Go side.

ALG.concurrency = {
  load = function(s, p, now)
    -- Drop expired leases: expiry <= now.
    redis.call('ZREMRANGEBYSCORE', s.key, '-inf', fmt(now))
    s.size = redis.call('ZCARD', s.key)
  end,

  decide = function(p, s, now, cost, mode, apply)
    local d = decision(p)
    local held = min(s.size, p.rate)
    local g = grant(cost, p.rate - held, mode)
    if g == 0 then
      -- Wait for the earliest leases to expire until cost fits: the
      -- need-th slot in expiry order.
      local need = held + cost - p.rate
      local e = redis.call('ZRANGE', s.key, need - 1, need - 1, 'WITHSCORES')
      d.retry = tonumber(e[2]) - now
    elseif apply then
      add_members(s.key, fmt(now + p.period), s.id, 1, g)
      s.size = s.size + g
      held = held + g
      d.changed = true
    end
    d.granted, d.remaining = g, p.rate - held
    if s.size > 0 then
      -- The last lease to expire.
      local e = redis.call('ZRANGE', s.key, -1, -1, 'WITHSCORES')
      d.reset = tonumber(e[2]) - now
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

  -- refund: release exactly the slots the take added.
  refund = function(p, s, take_now, now, g)
    remove_members(s.key, s.id, g)
    s.size = redis.call('ZCARD', s.key)
    return true
  end,
}
