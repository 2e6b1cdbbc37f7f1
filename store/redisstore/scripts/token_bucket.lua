-- token_bucket: a bucket of Burst tokens refilled continuously at Rate per
-- Period. In exact units: one event costs A, the bucket holds c = Burst*A
-- and gains B per µs (A/B = Period/Rate, reduced by Compile).
-- State: a hash {tokens, ts}: the tokens at µs ts. No key = a full bucket.

-- refilled returns the tokens at now: the stored ones plus el*B, capped at c.
local function tb_tokens(p, s, now, c)
  local tokens = c
  if s.ts ~= 0 then
    tokens = min(s.level, c)
    local el = now - s.ts
    if el > 0 then
      -- Compare before multiplying: el*B only when it stays below c.
      if el >= ceil_div(c - tokens, p.b) then
        tokens = c
      else
        tokens = tokens + el * p.b
      end
    end
  end
  return tokens
end

ALG.token_bucket = {
  load = function(s, p, now)
    s.level, s.ts = 0, 0
    local v = redis.call('HMGET', s.key, 'tokens', 'ts')
    if v[1] then
      s.level, s.ts = tonumber(v[1]), tonumber(v[2])
    end
  end,

  decide = function(p, s, now, cost, mode, apply)
    local d = decision(p)
    local c = p.burst * p.a
    local tokens = tb_tokens(p, s, now, c)
    local g = grant(cost, idiv(tokens, p.a), mode)
    if g == 0 then
      d.retry = ceil_div(cost * p.a - tokens, p.b) -- until cost*A tokens are in
    elseif apply then
      tokens = tokens - g * p.a
      s.level, s.ts = tokens, now
      d.changed = true
    end
    d.granted, d.remaining = g, idiv(tokens, p.a)
    d.reset = ceil_div(c - tokens, p.b) -- until the bucket is full
    d.allowed = d.granted > 0
    return d
  end,

  save = function(s, ttl)
    if ttl <= 0 then
      redis.call('DEL', s.key)
      return
    end
    redis.call('HSET', s.key, 'tokens', fmt(s.level), 'ts', fmt(s.ts))
    redis.call('PEXPIRE', s.key, ms(ttl))
  end,

  -- refund: put g*A tokens back at now, capped at c. Refilling is linear
  -- below the cap, so this is the state the bucket would have without the
  -- take: min(min(x - gA, c) + gA, c) = min(x, c).
  refund = function(p, s, take_now, now, g)
    if s.ts == 0 then
      return false -- expired: the bucket is full anyway
    end
    local c = p.burst * p.a
    local tokens = tb_tokens(p, s, now, c)
    if tokens >= c - g * p.a then
      tokens = c
    else
      tokens = tokens + g * p.a
    end
    s.level, s.ts = tokens, max(now, s.ts)
    return true
  end,
}
