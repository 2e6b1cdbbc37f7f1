-- fixed_window: a counter per window, windows aligned to the Unix epoch.
-- A calendar window (algorithm/calendar.go) is identified by its start.
-- State: a string "<window>:<count>" with PEXPIRE at the window's end.

ALG.fixed_window = {
  load = function(s, p, now)
    s.window, s.count = get_pair(s.key)
  end,

  decide = function(p, s, now, cost, mode, apply)
    local d = decision(p)
    local w, wend = fw_window(p, now) -- the window now falls in
    local count = s.count
    if s.window ~= w then
      count = 0 -- a new window starts empty
    end
    count = min(count, p.rate)
    local g = grant(cost, p.rate - count, mode)
    local fin = wend - now -- µs until this window ends
    if g == 0 then
      d.retry = fin -- the next window admits anything up to Rate
    elseif apply then
      count = count + g
      s.window, s.count = w, count
      d.changed = true
    end
    d.granted, d.remaining = g, p.rate - count
    if count > 0 then
      d.reset = fin
    end
    return d
  end,

  save = function(s, pttl)
    set_string(s.key, fmt(s.window) .. ':' .. fmt(s.count), pttl)
  end,

  -- refund: the g events counted at take_now leave the count, if that
  -- window is still the stored one (a later window forgot them anyway).
  refund = function(p, s, take_now, now, g)
    if s.window ~= fw_window(p, take_now) or s.count == 0 then
      return false
    end
    s.count = max(s.count - g, 0)
    return true
  end,
}
