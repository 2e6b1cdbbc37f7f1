-- gcra: the generic cell rate algorithm (redis-cell semantics). The state is
-- the theoretical arrival time TAT; a request fits while TAT - now leaves
-- room for its cells in a burst of c = Burst*A units. TAT is kept as whole
-- µs plus a fraction in units of 1/B µs, so nothing is ever rounded.
-- State: a string "<tat_us>:<frac>". No key = an idle key.

-- gcra_diff returns TAT - now in units of 1/B µs, in [0, c].
local function gcra_diff(p, s, now, c)
  local diff = 0
  if s.tat ~= 0 then
    local ahead = s.tat - now
    if ahead > idiv(c, p.b) and not s.debt then
      diff = c -- guard before multiplying: ahead*B would pass c
    elseif ahead > idiv(c, p.b) then
      diff = ahead * p.b + s.frac -- in debt: debt_cap_units bounds it
    else
      -- When ahead < 0 the product may be large and inexact, but it keeps
      -- its sign and max() clamps it to 0, as the exact value would be.
      diff = max(ahead * p.b + s.frac, 0)
    end
  end
  return diff
end

ALG.gcra = {
  load = function(s, p, now)
    s.tat, s.frac, s.debt = get_pair(s.key)
  end,

  decide = function(p, s, now, cost, mode, apply)
    local d = decision(p)
    local c = p.burst * p.a
    local diff = gcra_diff(p, s, now, c)
    local g = grant(cost, idiv(max(c - diff, 0), p.a), mode)
    if g == 0 then
      -- (diff - c) + cost*A: the same value as Go's diff+cost*A-c, summed in
      -- an order that never passes 2^53.
      d.retry = ceil_div((diff - c) + cost * p.a, p.b)
    elseif apply then
      diff = diff + g * p.a
      s.tat, s.frac = now + idiv(diff, p.b), imod(diff, p.b)
      s.debt = false -- it fitted: diff <= c
      d.changed = true
    end
    d.granted, d.remaining = g, idiv(max(c - diff, 0), p.a)
    d.reset = ceil_div(diff, p.b) -- until TAT
    return d
  end,

  save = function(s, pttl)
    set_string(s.key, fmt(s.tat) .. ':' .. fmt(s.frac) .. debt_suffix(s), pttl)
  end,

  -- fast: take_one of a plain limit's take (see ALG in prelude.lua),
  -- load, gcra_diff, decide, take and persist inlined for a state not in
  -- debt; a state in debt goes the generic way.
  fast = function(p, key, now, cost, mode, out, o)
    local tat, frac = 0, 0
    local a, b = p.a, p.b
    local c = p.burst * a
    local v
    local g0 = grant(cost, p.burst, mode) -- what an absent state grants: idiv(c, a)
    if NXGET and g0 > 0 then
      -- Written only if the key is absent, as the lines below would
      -- write it then (TAT g0 cells past now); else its value.
      local d0 = g0 * a
      local reset0 = ceil_div(d0, b)
      v = redis.call('SET', key, string.format('%d:%d', now + idiv(d0, b), imod(d0, b)), 'NX', 'PX', ms(reset0), 'GET')
      if not v then
        out[o], out[o + 1], out[o + 2], out[o + 3] = 1, g0, p.cap, idiv(c - d0, a)
        out[o + 4], out[o + 5], out[o + 6], out[o + 7] = 0, reset0, 0, 0
        return true
      end
    else
      v = redis.call('GET', key)
    end
    if v then
      if string.find(v, ':d', 1, true) then
        return false -- in debt
      end
      local i = string.find(v, ':', 1, true)
      tat, frac = tonumber(string.sub(v, 1, i - 1)), tonumber(string.sub(v, i + 1))
    end
    local diff = 0
    if tat ~= 0 then
      local ahead = tat - now
      if ahead > idiv(c, b) then
        diff = c -- guard before multiplying: ahead*B would pass c
      else
        diff = max(ahead * b + frac, 0)
      end
    end
    local g = grant(cost, idiv(max(c - diff, 0), a), mode)
    local retry = 0
    if g == 0 then
      retry = ceil_div((diff - c) + cost * a, b)
    else
      diff = diff + g * a
      tat, frac = now + idiv(diff, b), imod(diff, b)
    end
    local reset = ceil_div(diff, b)
    local allowed = 0
    if g > 0 then
      allowed = 1
      if reset <= 0 then
        redis.call('DEL', key)
      else
        redis.call('SET', key, string.format('%d:%d', tat, frac), 'PX', ms(reset))
      end
    end
    out[o], out[o + 1], out[o + 2], out[o + 3] = allowed, g, p.cap, idiv(max(c - diff, 0), a)
    out[o + 4], out[o + 5], out[o + 6], out[o + 7] = retry, reset, 0, 0
    return true
  end,

  -- refund: move TAT back by g cells, measured from now and floored at now
  -- (TAT advances linearly, so this is the TAT without the take).
  refund = function(p, s, take_now, now, g)
    if s.tat == 0 then
      return false
    end
    local c = p.burst * p.a
    local diff = max(gcra_diff(p, s, now, c) - g * p.a, 0)
    s.tat, s.frac = now + idiv(diff, p.b), imod(diff, p.b)
    s.debt = s.debt and diff > c
    return true
  end,

  -- debit: move TAT n cells on, past the burst if need be (debt), at most
  -- debt_cap_units past it (gcraDebit).
  debit = function(p, s, now, n)
    local c = p.burst * p.a
    local diff = add_capped(gcra_diff(p, s, now, c), n, p.a, c + debt_cap_units(p, c))
    s.tat, s.frac = now + idiv(diff, p.b), imod(diff, p.b)
    s.debt = diff > c
  end,

  -- credit: move TAT back n cells, floored at now (gcraCredit).
  credit = function(p, s, now, n)
    local c = p.burst * p.a
    local diff = sub_floored(gcra_diff(p, s, now, c), n, p.a)
    s.tat, s.frac = now + idiv(diff, p.b), imod(diff, p.b)
    s.debt = diff > c
  end,
}
