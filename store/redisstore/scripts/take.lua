-- take: one decision. scripts.go puts it in the library and, after the
-- prelude and one algorithm, in each algorithm's EVAL script.
--
-- KEYS[1]  the state key          <prefix>:{<key>}:<algorithm>
-- KEYS[2]  the penalty-box key    <prefix>:{<key>}:block
-- ARGV[1]  now in µs, or '' to read Redis TIME (the normal case)
-- ARGV[2]  n, the cost (0 peeks)
-- ARGV[3]  mode: 0 all or nothing, 1 at most n, 2 debit, 3 credit (refund),
--          4 settle (a refund that settles a dated take)
-- ARGV[4]  member id for sliding_log entries and concurrency leases; with
--          mode 4, the take it settles: "<at_us>:<cost>:<remaining>"
-- ARGV[5]  the compiled limit, packed (see limit_of)
--
-- Reply: {allowed, granted, limit, remaining, retry_after_us,
--         reset_after_us, delay_us, blocked_until_us, now_us}

local function weir_take(KEYS, ARGV)
  nxget()
  local p = limit_of(ARGV[5])
  local now = clock(ARGV[1])
  local n, mode = tonumber(ARGV[2]), tonumber(ARGV[3])
  if p.ovr then
    local maxcost
    p, maxcost = override_of(p, KEYS[2], now)
    n = override_cost(maxcost, n, mode)
  end
  local out = {}
  -- A plain take: the algorithm's fast path, if it has one (see ALG in
  -- prelude.lua), makes it whole or reads only and leaves it to take_one.
  local fast = p.plain and mode <= ATMOST and n > 0 and ALG[p.kind].fast
  if not (fast and fast(p, KEYS[1], now, n, mode, out, 1)) then
    put(out, take_one(p, KEYS[1], KEYS[2], ARGV[4], now, n, mode))
  end
  out[9] = now
  return out
end
