-- warmup: a token bucket's or GCRA's cold start, mirroring
-- algorithm/warmup.go function for function (warm_fill: warmFill,
-- warm_tokens: warmTokens, warm_wait: warmWait, warm_decide: warmBucket,
-- warm_refund: warmRefund). scripts.go places it after the algorithm files
-- and it wraps ALG.token_bucket and ALG.gcra: a limit with p.warm > 0 runs
-- these functions on a hash {tokens, ts, t0} (in warm-up units: an event
-- is A*3*WARMUP_STEPS), under a state key of its own (the store appends
-- "+warmup" to the algorithm's name); any other runs the plain algorithm.

local WARMUP_STEPS = 10

local function warm_step(p, t0, t)
  return min(idiv(max(t - t0, 0), p.wstep), WARMUP_STEPS)
end

local function warm_rate(p, k)
  return p.b * (WARMUP_STEPS + 2 * k)
end

local function warm_cap(p, k)
  return p.burst * p.a * (WARMUP_STEPS + 2 * k)
end

local function warm_fill(lvl, t, fin, r, c)
  if lvl >= c then
    return c
  end
  if fin - t >= ceil_div(c - lvl, r) then
    return c
  end
  return lvl + (fin - t) * r
end

local function warm_tokens(p, s, now)
  if s.ts == 0 then
    return warm_cap(p, 0), now
  end
  local lvl, t, t0 = s.level, s.ts, s.t0
  while t < now do
    local k = warm_step(p, t0, t)
    local fin = now
    if k < WARMUP_STEPS then
      fin = min(now, t0 + (k + 1) * p.wstep)
    end
    lvl = warm_fill(lvl, t, fin, warm_rate(p, k), warm_cap(p, k))
    t = fin
  end
  if lvl >= warm_cap(p, WARMUP_STEPS) then
    return warm_cap(p, 0), now -- idle: the bucket is full, a new warm-up starts
  end
  return min(lvl, warm_cap(p, warm_step(p, t0, now))), t0
end

local function warm_wait(p, t0, now, tokens, target)
  local lvl, t = tokens, now
  while lvl < target do
    local k = warm_step(p, t0, t)
    local r = warm_rate(p, k)
    if k >= WARMUP_STEPS then
      return t - now + ceil_div(target - lvl, r)
    end
    local fin = t0 + (k + 1) * p.wstep
    if warm_cap(p, k) >= target then
      local need = ceil_div(target - lvl, r)
      if t + need <= fin then
        return t + need - now
      end
    end
    lvl = warm_fill(lvl, t, fin, r, warm_cap(p, k))
    t = fin
  end
  return t - now
end

local function warm_decide(p, s, now, cost, mode, apply)
  local d = decision(p)
  local u = p.a * 3 * WARMUP_STEPS
  local tokens, t0 = warm_tokens(p, s, now)
  local started = s.ts == 0 or t0 ~= s.t0
  local g = grant(cost, idiv(tokens, u), mode)
  if g == 0 then
    d.retry = warm_wait(p, t0, now, tokens, cost * u)
  end
  if apply and (g > 0 or started) then
    tokens = tokens - g * u
    s.level, s.ts, s.t0 = tokens, now, t0
    d.changed = true
  end
  d.granted, d.remaining = g, idiv(tokens, u)
  d.reset = warm_wait(p, t0, now, tokens, warm_cap(p, WARMUP_STEPS))
  return d
end

local function warm_refund(p, s, take_now, now, g)
  if s.ts == 0 then
    return false
  end
  local u = p.a * 3 * WARMUP_STEPS
  if s.ts == take_now then
    -- Nothing has refilled since the take: give back at take_now, exactly;
    -- a take that started the warm-up leaves the key cold again.
    local lvl = min(s.level + g * u, warm_cap(p, warm_step(p, s.t0, take_now)))
    if s.t0 == take_now and lvl >= warm_cap(p, 0) then
      s.level, s.ts, s.t0 = 0, 0, 0 -- cold, as before the take (save deletes the key)
      return true
    end
    s.level = lvl
    return true
  end
  local tokens, t0 = warm_tokens(p, s, now)
  if t0 ~= s.t0 then
    return false -- cold again: nothing to give back
  end
  s.level = min(tokens + g * u, warm_cap(p, warm_step(p, t0, now)))
  s.ts = max(now, s.ts)
  return true
end

-- warmable wraps a bucket's functions: a warm-up limit's state is the
-- hash {tokens, ts, t0}.
local function warmable(alg)
  if not alg then
    return -- a take script carrying another algorithm
  end
  local load, decide_plain, save_plain, refund = alg.load, alg.decide, alg.save, alg.refund
  alg.load = function(s, p, now)
    if p.warm == 0 then
      return load(s, p, now)
    end
    s.warm = true
    s.level, s.ts, s.t0 = 0, 0, 0
    local v = redis.call('HMGET', s.key, 'tokens', 'ts', 't0')
    if v[1] then
      s.level, s.ts, s.t0 = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
    end
  end
  alg.decide = function(p, s, now, cost, mode, apply)
    if p.warm == 0 then
      return decide_plain(p, s, now, cost, mode, apply)
    end
    return warm_decide(p, s, now, cost, mode, apply)
  end
  alg.save = function(s, pttl)
    if not s.warm then
      return save_plain(s, pttl)
    end
    if s.ts == 0 then
      redis.call('DEL', s.key) -- a refund left the key cold: no state
      return
    end
    set_hash(s.key, pttl, 'tokens', fmt(s.level), 'ts', fmt(s.ts), 't0', fmt(s.t0))
  end
  alg.refund = function(p, s, take_now, now, g)
    if p.warm == 0 then
      return refund(p, s, take_now, now, g)
    end
    return warm_refund(p, s, take_now, now, g)
  end
end

warmable(ALG.token_bucket)
warmable(ALG.gcra)
