-- fixed_window: a counter per window, windows aligned to the Unix epoch.
-- A calendar window (algorithm/calendar.go) is identified by its start.
-- State: a string "<window>:<count>" with PEXPIRE at the window's end; in
-- debt "<window>:<count>:d<rate>", the rate its debt is paid back at
-- (algorithm.carryRate; a bare ":d" from a version that kept none).

-- fw_count mirrors fwCount: the count of window w, capped at the rate (a
-- lowered limit); 0 in a later window, unless the state is in debt, whose
-- excess carries on, paid back at carry_rate per window. A calendar
-- window's debt does not carry: each calendar period starts empty.
local function fw_count(p, s, w)
  local count = s.count
  if s.window ~= w then
    count = 0 -- a new window starts empty
    if s.debt and s.window < w and not p.cal then
      local r = carry_rate(p, s)
      local k = w - s.window
      if k <= idiv(s.count, r) then
        count = s.count - k * r
      end
    end
  end
  if not s.debt then
    count = min(count, p.rate)
  end
  return count
end

ALG.fixed_window = {
  load = function(s, p, now)
    s.window, s.count, s.debt, s.drate = get_pair(s.key)
  end,

  decide = function(p, s, now, cost, mode, apply)
    local d = decision(p)
    local w, wend = fw_window(p, now) -- the window now falls in
    local count = fw_count(p, s, w)
    local r = carry_rate(p, s) -- what a count over the rate pays back per window
    if p.cal then
      r = max(count, p.rate) -- no debt carries: the next window is empty
    end
    local g = grant(cost, p.rate - count, mode)
    local fin = wend - now -- µs until this window ends
    if g == 0 then
      -- The next window admits anything up to Rate; in debt, the first
      -- window whose carried count leaves room for cost.
      d.retry = fin + (ceil_div(count + cost - p.rate, r) - 1) * p.period
    elseif apply then
      count = count + g
      s.window, s.count = w, count
      set_debt(p, s, false)
      d.changed = true
    end
    d.granted, d.remaining = g, max(p.rate - count, 0)
    if count > 0 then
      d.reset = fin + (ceil_div(count, r) - 1) * p.period
    end
    return d
  end,

  save = function(s, pttl)
    set_string(s.key, fmt(s.window) .. ':' .. fmt(s.count) .. debt_suffix(s), pttl)
  end,

  -- fast: take_one of a plain limit's take (see ALG in prelude.lua),
  -- load, fw_window, fw_count, decide, take and persist inlined for a
  -- state not in debt and now >= 0; a state in debt goes the generic way.
  fast = function(p, key, now, cost, mode, out, o)
    if now < 0 then
      return false
    end
    local rate, period = p.rate, p.period
    local w = math.floor(now / period) -- idiv(now, period): now >= 0
    local fin = (w + 1) * period - now
    local window, count = 0, 0
    local v
    local g0 = grant(cost, rate, mode) -- what an absent state grants
    if NXGET and g0 > 0 then
      -- Written only if the key is absent, as the lines below would
      -- write it then (count g0 in window w, reset at fin); else its value.
      v = redis.call('SET', key, string.format('%d:%d', w, g0), 'NX', 'PX', ms(fin), 'GET')
      if not v then
        out[o], out[o + 1], out[o + 2], out[o + 3] = 1, g0, p.cap, rate - g0
        out[o + 4], out[o + 5], out[o + 6], out[o + 7] = 0, fin, 0, 0
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
      window, count = tonumber(string.sub(v, 1, i - 1)), tonumber(string.sub(v, i + 1))
    end
    if window ~= w then
      count = 0
    elseif count > rate then
      count = rate
    end
    -- grant(cost, rate - count, mode)
    local g = rate - count
    if g >= cost then
      g = cost
    elseif mode ~= ATMOST or g <= 0 then
      g = 0
    end
    local retry, reset = 0, 0
    if g == 0 then
      retry = fin + (ceil_div(count + cost - rate, rate) - 1) * period
    else
      count = count + g
    end
    if count > 0 then
      local k = math.floor(count / rate) -- ceil_div(count, rate), inlined
      if k * rate < count then
        k = k + 1
      end
      reset = fin + (k - 1) * period
    end
    local allowed = 0
    if g > 0 then
      allowed = 1
      if reset <= 0 then
        redis.call('DEL', key)
      else
        redis.call('SET', key, string.format('%d:%d', w, count), 'PX', ms(reset))
      end
    end
    local remaining = rate - count
    if remaining < 0 then
      remaining = 0
    end
    out[o], out[o + 1], out[o + 2], out[o + 3] = allowed, g, p.cap, remaining
    out[o + 4], out[o + 5], out[o + 6], out[o + 7] = retry, reset, 0, 0
    return true
  end,

  -- refund: the g events counted at take_now leave the count, if that
  -- window is still the stored one (a later window forgot them anyway).
  refund = function(p, s, take_now, now, g)
    if p.cal and take_now < p.cal[1] then
      return false -- before the window before now's: long forgotten
    end
    if s.window ~= fw_window(p, take_now) or s.count == 0 then
      return false
    end
    s.count = max(s.count - g, 0)
    if s.count <= p.rate then
      set_debt(p, s, false)
    end
    return true
  end,

  -- debit: count n more in the current window, past the rate if need be
  -- (debt), up to debt_cap_events (fixedWindowDebit).
  debit = function(p, s, now, n)
    local w = fw_window(p, now)
    local count = add_capped(fw_count(p, s, w), n, 1, debt_cap_events(p))
    s.window, s.count = w, count
    set_debt(p, s, count > p.rate)
  end,

  -- credit: count n fewer in the current window, floored at 0
  -- (fixedWindowCredit).
  credit = function(p, s, now, n)
    local w = fw_window(p, now)
    local count = max(fw_count(p, s, w) - n, 0)
    s.window, s.count = w, count
    set_debt(p, s, count > p.rate)
  end,
}
