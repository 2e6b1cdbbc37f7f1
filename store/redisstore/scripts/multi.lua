-- multi: all-or-nothing decisions over several keys of one hash slot (any
-- keys at all on a standalone server), and the refund that undoes a group
-- of them. scripts.go builds prelude + every algorithm file + multi.lua.
--
-- KEYS[2i-1], KEYS[2i]  request i's state and penalty-box keys
-- ARGV[1]  'take' or 'refund'
-- ARGV[2]  now in µs, or '' to read Redis TIME
-- ARGV[3]  refund only: the now at which the refunded take ran
-- then 5 values per request:
--   n, mode, member id, granted (refund only), the compiled limit packed
--   (see limit_of)
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
  end
  if all then
    out[1] = 1
  end
  return out
end
