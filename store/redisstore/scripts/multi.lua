-- multi: all-or-nothing decisions over several keys of one hash slot (any
-- keys at all on a standalone server), and the refund that undoes a group
-- of them. scripts.go builds prelude + every algorithm file + multi.lua.
--
-- KEYS[2i-1], KEYS[2i]  request i's state and penalty-box keys
-- ARGV[1]  'take' or 'refund'
-- ARGV[2]  now in µs, or '' to read Redis TIME
-- ARGV[3]  refund: the now at which the refunded take ran; take: '' or,
--          when some requests' rules have events, the number of requests m
-- then 5 values per request:
--   n, mode, member id, granted (refund only), the compiled limit packed
--   (see limit_of)
-- With events (take only), after the 2m keys: KEYS[2m+1..2m+3] the event
-- stream, its counter and the boxes due, then one marker key per request
-- with events; after the 5m values, 9 per such request: its number i and
-- events.lua's settings (ARGV[6..13] of take_events). Their events are
-- recorded after phase 2, in the same call (events_check).
--
-- take:   phase 1 checks every request without writing (algorithm.Check);
--         if all are admitted, phase 2 takes them all; otherwise nothing is
--         consumed and only the requests that were rejected take, which
--         starts their penalty boxes, exactly as memstore.TakeAll.
-- refund: gives back what request i's take granted, then reports what a
--         check would say now, with nothing granted.
--
-- Reply: {all_admitted, now_us, then 8 values per request as put() writes}

local function weir_multi(KEYS, ARGV)
  local W = 5 -- 4 per request + the packed compiled limit
  local op = ARGV[1]
  local now = clock(ARGV[2])
  local m = #KEYS / 2
  local evn = 0 -- requests with events
  if op == 'take' and ARGV[3] ~= '' then
    m = tonumber(ARGV[3])
    evn = #KEYS - 2 * m - 3
  end
  local reqs = {}
  for i = 1, m do
    local b = 4 + (i - 1) * W
    local p = limit_of(ARGV[b + 4])
    local n, mode = tonumber(ARGV[b]), tonumber(ARGV[b + 1])
    if p.ovr then
      local maxcost
      p, maxcost = override_of(p, KEYS[2 * i], now)
      if op ~= 'refund' and maxcost and mode <= ATMOST and n > maxcost then
        if mode ~= ATMOST then
          error('WEIRCOST ' .. fmt(maxcost) .. ' ' .. i) -- the request's number
        end
        n = maxcost
      end
    end
    local r = {
      p = p, alg = ALG[p.kind],
      n = n, mode = mode, id = ARGV[b + 2],
      granted = tonumber(ARGV[b + 3]),
    }
    r.s = load(r.alg, p, KEYS[2 * i - 1], KEYS[2 * i], r.id, now, op == 'refund')
    reqs[i] = r
  end

  local out = { 0, now }

  if op == 'refund' then
    local take_now = tonumber(ARGV[3])
    for i = 1, m do
      local r = reqs[i]
      local changed = false
      if r.granted > 0 then
        changed = r.alg.refund(r.p, r.s, take_now, now, r.granted)
      end
      local d = take(r.alg, r.p, r.s, now, r.n, r.mode, false)
      if changed then
        save(r.alg, r.s, d.reset)
      end
      d.granted, d.delay = 0, 0
      put(out, d)
    end
    return out
  end

  -- Phase 1: check every request; nothing is written.
  local all = true
  local checks = {}
  for i = 1, m do
    local r = reqs[i]
    checks[i] = take(r.alg, r.p, r.s, now, r.n, r.mode, false)
    all = all and checks[i].allowed
  end
  -- Phase 2: take them all, or only the rejected ones (which consume nothing
  -- but start their penalty boxes); the rest report their check.
  local ds = {}
  for i = 1, m do
    local r = reqs[i]
    local d = checks[i]
    if all or not d.allowed then
      d = take(r.alg, r.p, r.s, now, r.n, r.mode, true)
      persist(r.alg, r.p, r.s, d)
    else
      d.granted, d.delay = 0, 0
    end
    put(out, d)
    ds[i] = d
  end
  if all then
    out[1] = 1
  end
  local base = 3 + W * m
  for j = 1, evn do
    local a = base + (j - 1) * 9
    local i = tonumber(ARGV[a + 1])
    local d, allowed = ds[i], 0
    if d.allowed then
      allowed = 1
    end
    events_check(KEYS[2 * m + 3 + j], KEYS[2 * m + 1], KEYS[2 * m + 2], KEYS[2 * m + 3],
      {ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7], ARGV[a + 8], ARGV[a + 9]},
      allowed, d.granted, d.limit, d.remaining, d.reset, now, reqs[i].n, d.blocked)
  end
  return out
end
