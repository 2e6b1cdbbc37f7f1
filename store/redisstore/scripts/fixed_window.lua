-- fixed_window: a counter per window, windows aligned to the Unix epoch.
-- A calendar window (algorithm/calendar.go) is identified by its start.
-- State: a string "<window>:<count>" with PEXPIRE at the window's end; in
-- debt "<window>:<count>:d<rate>", the rate its debt is paid back at
-- (algorithm.carryRate; a bare ":d" from a version that kept none).

-- fw_count mirrors fwCount: the count of window w, capped at the rate (a
-- lowered limit); 0 in a later window, unless the state is in debt, whose
-- excess carries on, paid back at carry_rate per window.
local function fw_count(p, s, w)
  local count = s.count
  if s.window ~= w then
    count = 0 -- a new window starts empty
    if s.debt and s.window < w then
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

  -- refund: the g events counted at take_now leave the count, if that
  -- window is still the stored one (a later window forgot them anyway).
  refund = function(p, s, take_now, now, g)
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
