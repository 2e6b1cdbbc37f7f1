-- token_bucket: a bucket of Burst tokens refilled continuously at Rate per
-- Period. In exact units: one event costs A, the bucket holds c = Burst*A
-- and gains B per µs (A/B = Period/Rate, reduced by Compile).
-- State: a hash {tokens, ts}: the bucket's content at µs ts, in units (an
-- event is A of them, so tokens is Burst*A when full), which the code holds
-- in s.level as algorithm.State.Level. No key = a full bucket. A stored
-- content above c (the burst was lowered since) counts as c.
-- refund undoes a take when a cluster batch that spans slots is refunded
-- (multi.lua).

-- tb_tokens returns the content at now: the stored one plus el*B, capped
-- at c, as token_bucket.go's tbTokens does.
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
    d.granted, d.remaining = g, idiv(max(tokens, 0), p.a) -- tokens < 0: in debt
    d.reset = ceil_div(c - tokens, p.b) -- until the bucket is full
    return d
  end,

  save = function(s, pttl)
    set_hash(s.key, pttl, 'tokens', fmt(s.level), 'ts', fmt(s.ts))
  end,

  -- fast: take_one of a plain limit's take (see ALG in prelude.lua),
  -- load, tb_tokens, decide, take and persist inlined.
  fast = function(p, key, now, cost, mode, out, o)
    local level, ts = 0, 0
    local v = redis.call('HMGET', key, 'tokens', 'ts')
    if v[1] then
      level, ts = tonumber(v[1]), tonumber(v[2])
    end
    local a, b = p.a, p.b
    local c = p.burst * a
    local tokens = c
    if ts ~= 0 then
      tokens = min(level, c)
      local el = now - ts
      if el > 0 then
        -- Compare before multiplying: el*B only when it stays below c.
        if el >= ceil_div(c - tokens, b) then
          tokens = c
        else
          tokens = tokens + el * b
        end
      end
    end
    -- What follows is decide's grant, idiv and ceil_div, inlined.
    local floor = math.floor
    local g -- grant(cost, idiv(tokens, a), mode)
    if tokens < 0 then
      g = -floor(-tokens / a)
    else
      g = floor(tokens / a)
    end
    if g >= cost then
      g = cost
    elseif mode ~= ATMOST or g <= 0 then
      g = 0
    end
    local retry = 0
    if g == 0 then
      retry = ceil_div(cost * a - tokens, b)
    else
      tokens = tokens - g * a
    end
    local reset, x = 0, c - tokens -- reset = ceil_div(x, b)
    if x > 0 then
      reset = floor(x / b)
      if reset * b < x then
        reset = reset + 1
      end
    end
    local allowed = 0
    if g > 0 then
      allowed = 1
      if reset <= 0 then
        redis.call('DEL', key)
      else
        redis.call('HSET', key, 'tokens', string.format('%d', tokens), 'ts', string.format('%d', now))
        redis.call('PEXPIRE', key, ms(reset))
      end
    end
    local remaining = 0 -- idiv(max(tokens, 0), a)
    if tokens > 0 then
      remaining = floor(tokens / a)
    end
    out[o], out[o + 1], out[o + 2], out[o + 3] = allowed, g, p.cap, remaining
    out[o + 4], out[o + 5], out[o + 6], out[o + 7] = retry, reset, 0, 0
    return true
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

  -- debit: take n*A tokens at now, below 0 if need be (debt), down to
  -- -debt_cap_units (tokenBucketDebit).
  debit = function(p, s, now, n)
    local c = p.burst * p.a
    local low = debt_cap_units(p, c)
    local tokens = tb_tokens(p, s, now, c)
    s.level, s.ts = -add_capped(-tokens, n, p.a, low), now
  end,

  -- credit: put n*A tokens back at now, capped at c (tokenBucketCredit).
  credit = function(p, s, now, n)
    local c = p.burst * p.a
    local tokens = tb_tokens(p, s, now, c)
    s.level, s.ts = c - sub_floored(c - tokens, n, p.a), now
  end,
}
