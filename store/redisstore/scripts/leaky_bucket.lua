-- leaky_bucket: a bucket that drains at Rate per Period. Each admitted
-- event adds A units; it holds c = Burst*A and leaks B per µs. Policing
-- rejects what does not fit; shaping (MaxDelay > 0) admits up to a level of
-- room = min(c, MaxDelay*B + DelayAfter*A) and asks the caller to delay each
-- request until its units have drained below DelayAfter events (nginx's
-- burst without nodelay, and its delay=N).
-- State: a hash {level, ts}: the level at µs ts. No key = an empty bucket.

-- lb_level returns the level at now: the stored one minus el*B, floored at
-- 0, then capped at c (drain first, as algorithm.go: the level must not
-- depend on when the state was last written).
local function lb_level(p, s, now, c)
  local level = 0
  if s.ts ~= 0 then
    level = s.level
    local el = now - s.ts
    if el > 0 then
      -- Compare before multiplying: el*B only when it stays below level.
      if el >= ceil_div(level, p.b) then
        level = 0
      else
        level = level - el * p.b
      end
    end
    if not s.debt then
      level = min(level, c)
    end
  end
  return level
end

ALG.leaky_bucket = {
  load = function(s, p, now)
    s.level, s.ts = 0, 0
    local v = redis.call('HMGET', s.key, 'level', 'ts', 'd')
    if v[1] then
      s.level, s.ts = tonumber(v[1]), tonumber(v[2])
    end
    s.debt = v[3] == '1'
    s.had_debt = s.debt
  end,

  decide = function(p, s, now, cost, mode, apply)
    local d = decision(p)
    local c = p.burst * p.a
    local level = lb_level(p, s, now, c)
    -- room is the level a request may find and still be admitted, plus its own cost.
    local room = c
    if p.shaping then
      room = min(room, p.maxdelay * p.b + p.delayafter * p.a)
    end
    local g = grant(cost, idiv(max(room - level, 0), p.a), mode)
    if g == 0 then
      d.retry = ceil_div(level - (room - cost * p.a), p.b) -- until cost*A fits
    elseif apply then
      level = level + g * p.a
      s.level, s.ts = level, now
      s.debt = false -- it fitted: level <= room
      d.changed = true
    end
    if g > 0 and p.shaping then
      -- Hold the request until the level drains to DelayAfter events.
      local after = level
      if not apply then
        after = after + g * p.a
      end
      d.delay = max(ceil_div(after - p.delayafter * p.a, p.b), 0)
    end
    d.granted, d.remaining = g, idiv(max(room - level, 0), p.a)
    d.reset = ceil_div(level, p.b) -- until the bucket is empty
    return d
  end,

  save = function(s, pttl)
    set_hash(s.key, pttl, 'level', fmt(s.level), 'ts', fmt(s.ts))
    set_debt_field(s)
  end,

  -- fast: take_one of a plain limit's take (see ALG in prelude.lua),
  -- load, lb_level, decide, take and persist inlined for a state with no
  -- debt field; one with it goes the generic way.
  fast = function(p, key, now, cost, mode, out, o)
    local v = redis.call('HMGET', key, 'level', 'ts', 'd')
    if v[3] then
      return false -- in debt, or was
    end
    local level, ts = 0, 0
    if v[1] then
      level, ts = tonumber(v[1]), tonumber(v[2])
    end
    local a, b = p.a, p.b
    local c = p.burst * a
    local lvl = 0
    if ts ~= 0 then
      lvl = level
      local el = now - ts
      if el > 0 then
        -- Compare before multiplying: el*B only when it stays below level.
        if el >= ceil_div(lvl, b) then
          lvl = 0
        else
          lvl = lvl - el * b
        end
      end
      lvl = min(lvl, c)
    end
    local room = c
    if p.shaping then
      room = min(room, p.maxdelay * b + p.delayafter * a)
    end
    local g = grant(cost, idiv(max(room - lvl, 0), a), mode)
    local retry, delay = 0, 0
    if g == 0 then
      retry = ceil_div(lvl - (room - cost * a), b) -- until cost*A fits
    else
      lvl = lvl + g * a
      if p.shaping then
        delay = max(ceil_div(lvl - p.delayafter * a, b), 0)
      end
    end
    local reset = ceil_div(lvl, b)
    local allowed = 0
    if g > 0 then
      allowed = 1
      if reset <= 0 then
        redis.call('DEL', key)
      else
        redis.call('HSET', key, 'level', fmt(lvl), 'ts', fmt(now))
        redis.call('PEXPIRE', key, ms(reset))
      end
    end
    out[o], out[o + 1], out[o + 2], out[o + 3] = allowed, g, p.cap, idiv(max(room - lvl, 0), a)
    out[o + 4], out[o + 5], out[o + 6], out[o + 7] = retry, reset, delay, 0
    return true
  end,

  -- refund: take g*A units out at now, floored at 0; draining is linear
  -- above 0, so this is the level the bucket would have without the take.
  -- The take admitted, so the level it found was below c and uncapped:
  -- the state written here drains exactly as the one before the take
  -- would have, under this limit or a lowered one.
  refund = function(p, s, take_now, now, g)
    if s.ts == 0 then
      return false -- expired: the bucket is empty anyway
    end
    local level = lb_level(p, s, now, p.burst * p.a)
    s.level, s.ts = max(level - g * p.a, 0), max(now, s.ts)
    s.debt = s.debt and s.level > p.burst * p.a
    return true
  end,

  -- debit: pour n*A units in at now, over c if need be (debt), at most
  -- debt_cap_units over it (leakyBucketDebit). Policing only.
  debit = function(p, s, now, n)
    local c = p.burst * p.a
    local level = add_capped(lb_level(p, s, now, c), n, p.a, c + debt_cap_units(p, c))
    s.level, s.ts = level, now
    s.debt = level > c
  end,

  -- credit: take n*A units out at now, floored at 0 (leakyBucketCredit).
  credit = function(p, s, now, n)
    local c = p.burst * p.a
    local level = sub_floored(lb_level(p, s, now, c), n, p.a)
    s.level, s.ts = level, now
    s.debt = level > c
  end,
}
