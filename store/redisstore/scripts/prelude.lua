-- weir prelude: shared by every weir script. scripts.go concatenates it in
-- front of the algorithm files and one driver (take.lua or multi.lua), so
-- each algorithm's math exists once and both drivers run it.
--
-- The Go package algorithm is the reference, and both stores must agree to
-- the microsecond. The mirroring is function for function, with the same
-- step order and (in Lua's spelling) the same names:
--
--   prelude.lua                       algorithm/algorithm.go
--   take                              take (Take; with commit false, Check)
--   decide                            decide (the table's function, then allowed)
--   grant, ceil_div, decision(p)      grant, ceilDiv, Decision{Limit: p.Cap}
--   <algorithm>.lua ALG.x.decide      <algorithm>.go: fixedWindow, slidingLog,
--                                     slidingWindow (sw_buckets: slidingBuckets),
--                                     tokenBucket, leakyBucket, gcra, concurrency
--   helpers tb_tokens, lb_level,      tbTokens, lbLevel, gcraDiff, swCount
--     gcra_diff, sw_count
--   ALG.x.refund (multi.lua refund)   <algorithm>Refund (Refund)
--   settle, settle_room               settleRefund, settleRoom (SettleTake;
--     ALG.sliding_log.settle            Log.removeAt)
--
-- What only the Lua has: load and save (each algorithm's Redis encoding;
-- save below deletes a key whose state no longer matters), params (Go's
-- Params arrive in ARGV, computed by Compile), and the drivers take.lua,
-- batch.lua, multi.lua and release.lua. The sliding log and the
-- concurrency leases live in ZSETs read by rank and score rather than in
-- slices, and expire in load rather than as decide's first step (or,
-- when none stays, at the decision's end: GUARDED in batch.lua). A refund
-- finds the take's log member or lease by its call id; Go finds a named
-- lease by its id too, but an anonymous one (a memstore Take) by its
-- expiry, and a log's events by time, as it merges the calls of one
-- microsecond into one entry. Where a
-- Go sum could pass 2^53 only on the way to its result, the Lua orders it
-- so that it never does (gcra's RetryAfter). algorithm/algorithm.go's
-- package comment says the same from the Go side.
--
-- Numbers. A Lua 5.1 number is an IEEE double, which holds every integer
-- below 2^53 exactly. Every value weir stores or computes is such an integer
-- (algorithm.Compile rejects limits that would need more), and +, - and *
-- of them are exact while the result stays below 2^53; the code forms a
-- product only after a guard bounds it, exactly where the Go code does.
--
-- Division. For 0 <= a < 2^53 and an integer b >= 1, math.floor(a / b) is
-- exactly Go's a / b. Write a = q*b + r with 0 <= r < b. If r = 0 the double
-- quotient is q itself. Otherwise a/b lies in [q + 1/b, q + 1 - 1/b]; say it
-- lies in the binade [2^e, 2^(e+1)), where doubles are 2^(e-52) apart, so
-- rounding moves it by at most 2^(e-53). Reaching q + 1 would need
-- 1/b <= 2^(e-53), i.e. b >= 2^(53-e), and then a >= 2^e * b >= 2^53: a
-- contradiction. Rounding cannot go below q either, since q is a double. So
-- floor(double(a/b)) = q. (Lua's % is a - floor(a/b)*b, hence exact too, but
-- the code spells it out.)

local EXACT, ATMOST = 0, 1
-- The debt modes (algorithm.Debit, algorithm.Credit, algorithm.Settle;
-- see debt_op). SETTLE is a credit that settles a dated take: its member-id
-- argument is the take's "<at>:<cost>:<remaining>" (parse_taken).
local DEBIT, CREDIT, SETTLE = 2, 3, 4

-- min and max are Go's builtins, for two numbers. (Not math.min: a
-- library's top level runs when Redis loads it, where Redis 7.0 offers no
-- globals at all; function bodies see them when called.)
local function min(a, b)
  if b < a then
    return b
  end
  return a
end

local function max(a, b)
  if b > a then
    return b
  end
  return a
end

-- idiv is Go's integer a / b (truncating toward zero) for |a| < 2^53, b > 0.
local function idiv(a, b)
  if a < 0 then
    return -math.floor(-a / b)
  end
  return math.floor(a / b)
end

-- imod is Go's a % b for 0 <= a < 2^53, b > 0.
local function imod(a, b)
  return a - idiv(a, b) * b
end

-- ceil_div mirrors algorithm.ceilDiv: ceil(a/b) for a > 0, else 0. It never
-- forms a + b - 1, which could pass 2^53.
local function ceil_div(a, b)
  if a <= 0 then
    return 0
  end
  local q = math.floor(a / b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- fmt renders an integer in full. tostring and Redis's own number-to-string
-- conversion use %.14g, which would round a µs timestamp (16 digits).
local function fmt(x)
  return string.format('%d', x)
end

-- ms converts a TTL in µs to PEXPIRE milliseconds, rounded up so that a key
-- never expires while its state still matters.
-- It is fmt(max(ceil_div(us, 1000), 1)), inlined: every save calls it.
local function ms(us)
  if us <= 0 then
    return '1'
  end
  local q = math.floor(us / 1000)
  if q * 1000 < us then
    q = q + 1
  end
  return string.format('%d', q)
end

-- clock returns now in µs: the test clock's time when the Go side passed one
-- (Config.Clock; tests only), otherwise Redis's own TIME, so that every
-- application server shares one clock however skewed their own are.
local function clock(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- NXGET: the server takes SET with both NX and GET (Redis 7.0 and later).
-- The drivers set it (nxget) before a fast path runs, which then writes
-- an absent state's successor in the same command that reads it: SET NX
-- GET writes only if the key is absent and returns what it holds if not,
-- one command where GET then SET were two.
local NXGET = false

-- nxget sets NXGET from the server's version (a function body: the
-- library's top level sees no redis table in Redis 7.0).
local function nxget()
  NXGET = (redis.REDIS_VERSION_NUM or 0) >= 0x070000
end

-- grant mirrors algorithm.grant: how much of cost to admit given avail.
local function grant(cost, avail, mode)
  if avail >= cost then
    return cost
  end
  if mode == ATMOST and avail > 0 then
    return avail
  end
  return 0
end

-- zrem_except removes the members names[1..] from key's ZSET, in commands
-- of at most 1000 members, leaving out those in the set skip (nil: none).
-- (sliding_log's rewrite of old members, concurrency's expired leases.)
local function zrem_except(key, names, skip)
  local args = {}
  for i = 1, #names do
    if not (skip and skip[names[i]]) then
      args[#args + 1] = names[i]
    end
    if #args >= 1000 or (i == #names and #args > 0) then
      redis.call('ZREM', key, unpack(args))
      args = {}
    end
  end
end

-- NLIMIT is the number of values of one compiled limit (the fields of
-- scripts.go's limitArg), packed in one ARGV value (limit_of).
local NLIMIT = 15

-- params_ext reads the last field of a compiled limit (scripts.go's
-- extArgs and calendar.go): the settings most limits leave unset, "" for
-- none. It sets p.forget and p.esc (an escalating penalty) and p.cal (a
-- calendar window's bounds, see fw_window).
local function params_ext(p, ext)
  p.forget, p.warm = 0, 0
  if ext == '' then
    return
  end
  for part in string.gmatch(ext, '[^;]+') do
    local key = string.sub(part, 1, 1)
    local vals = {}
    for v in string.gmatch(string.sub(part, 3), '[^,]+') do
      vals[#vals + 1] = tonumber(v)
    end
    if key == 'e' then
      p.forget = vals[1]
      p.esc = vals -- vals[2..] are the boxes after the first
    elseif key == 'c' then
      p.cal = vals
    elseif key == 'w' then
      p.warm, p.wstep = vals[1], vals[2] -- warmup.lua
    elseif key == 'o' then
      p.ovr = string.sub(part, 3) -- the store keeps overrides: the limit's shape (override_of)
    end
    if key == 'c' then
      p.cext = part -- an override of a calendar limit takes the same bounds
    end
  end
end

-- params reads one compiled limit from ARGV[i..i+NLIMIT-1], in the order of
-- limitArg in scripts.go (limit_of below hands it the packed value's
-- fields). Every derived constant comes from Go's
-- algorithm.Compile; the scripts never recompute one. (The drivers take
-- KEYS and ARGV as arguments: a Redis function gets them that way, and an
-- EVAL script passes its globals.)
local function params(ARGV, i)
  local p = {
    kind = ARGV[i],
    rate = tonumber(ARGV[i + 1]),
    period = tonumber(ARGV[i + 2]),
    burst = tonumber(ARGV[i + 3]),
    block = tonumber(ARGV[i + 4]),
    maxdelay = tonumber(ARGV[i + 5]),
    delayafter = tonumber(ARGV[i + 6]),
    cap = tonumber(ARGV[i + 7]),
    a = tonumber(ARGV[i + 8]),
    b = tonumber(ARGV[i + 9]),
    tick = tonumber(ARGV[i + 10]),
    shaping = ARGV[i + 11] == '1',
    -- algorithm.Params.BoxOutlasts: a penalty box outlasts anything the
    -- (frozen) state could need, so a blocked check skips the state.
    outlasts = ARGV[i + 12] == '1',
    buckets = tonumber(ARGV[i + 13]), -- sliding_window: 0, or its buckets
  }
  params_ext(p, ARGV[i + 14])
  -- plain: no penalty box, calendar or warm-up, the common case for
  -- which an algorithm may have a fast take (ALG.x.fast, batch.lua).
  p.plain = p.block == 0 and not p.cal and p.warm == 0
  return p
end

-- A limit arrives packed in one ARGV value (scripts.go's limitArg): its
-- NLIMIT values in params' order, each followed by '|' but the last (the
-- extras, which hold no '|'). The library keeps what params made of it
-- between calls in LIMITS, keyed by the packed string itself, so that a
-- call of a limit seen before parses nothing: the string Redis hands the
-- function is the key, and any change of the limit (a new rate, a calendar
-- limit's next bounds) is a new string, parsed at once. A library's
-- top-level locals live as long as the library; an EVAL script's are made
-- anew on every call, so the EVAL form parses every time. LIMITS holds at
-- most LIMITS_MAX entries: the one that would pass the bound empties it
-- first. params' tables are never written after params returns, so one
-- may serve every call.
local LIMITS, NLIMITS, LIMITS_MAX = {}, 0, 256

-- limit_of returns the parsed limit of a packed ARGV value.
local function limit_of(packed)
  local p = LIMITS[packed]
  if p then
    return p
  end
  local v = {}
  for f in string.gmatch(packed .. '|', '([^|]*)|') do
    v[#v + 1] = f
  end
  if #v ~= NLIMIT then
    error('weir: a packed limit needs ' .. NLIMIT .. " '|'-separated values, got " .. #v)
  end
  p = params(v, 1)
  if NLIMITS >= LIMITS_MAX then
    LIMITS, NLIMITS = {}, 0
  end
  LIMITS[packed] = p
  NLIMITS = NLIMITS + 1
  return p
end

-- override_of returns the limit a decision on the key whose penalty-box
-- key is bkey runs under at now: its override's, if the store keeps
-- overrides (p.ovr, "o" in the packed limit's extras) and the key has a
-- live one, else p. An override lives in "<prefix>:{<tag>}:ovr", in the
-- same slot as the state, as "<until µs, 0 for none>|<its largest
-- cost>|<shape>|<packed limit>" (it applies only to a limit of the same
-- shape: override.Shape)
-- (redisstore's override.go); a calendar limit's override takes the
-- bounds the call sent. Read in the decision's own script, it binds every
-- decision from the moment its SET returned; a key without one costs one
-- GET of a missing key, and a coalesced call (batch.lua) reads none while
-- the index of overrides does not exist.
local function override_of(p, bkey, now)
  local v = redis.call('GET', string.sub(bkey, 1, -6) .. 'ovr')
  if not v then
    return p
  end
  local bar = string.find(v, '|', 1, true)
  local u = tonumber(string.sub(v, 1, bar - 1))
  if u ~= 0 and u <= now then
    return p -- expired by the store's clock
  end
  local bar2 = string.find(v, '|', bar + 1, true)
  local bar3 = string.find(v, '|', bar2 + 1, true)
  if string.sub(v, bar2 + 1, bar3 - 1) ~= p.ovr then
    return p -- made for a limit of another shape (algorithm, buckets, calendar, warm-up)
  end
  local maxcost = tonumber(string.sub(v, bar + 1, bar2 - 1))
  local packed = string.sub(v, bar3 + 1)
  if p.cext then
    if string.sub(packed, -1) == '|' then
      packed = packed .. p.cext
    else
      packed = packed .. ';' .. p.cext
    end
  end
  return limit_of(packed), maxcost
end

-- override_cost fits a take's cost to its override's largest (the store
-- checked it against the rule's): a partial grant asks for at most that,
-- and a larger cost is an error the store reports as weir.ErrInvalidCost.
local function override_cost(maxcost, n, mode)
  if maxcost and mode <= ATMOST and n > maxcost then
    if mode == ATMOST then
      return maxcost
    end
    error('WEIRCOST ' .. fmt(maxcost))
  end
  return n
end

-- cached_limits is the number of parsed limits the library holds (tests).
local function cached_limits()
  return NLIMITS
end

-- SMALL maps the ARGV strings of small integers (a batch's limit numbers,
-- costs and modes) to their numbers: a table lookup costs less than a call
-- of tonumber. Anything else goes to tonumber.
local SMALL = {
  ['0'] = 0, ['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4, ['5'] = 5, ['6'] = 6,
  ['7'] = 7, ['8'] = 8, ['9'] = 9, ['10'] = 10,
}

-- fw_window mirrors algorithm.fwWindow: the fixed window now falls in and
-- its end, in µs. A plain window is identified by its epoch-aligned index;
-- a calendar window by its start, found among the bounds the store sent
-- (the window its clock fell in, the one before and the two after).
local function fw_window(p, now)
  if not p.cal then
    local w = idiv(now, p.period)
    return w, (w + 1) * p.period
  end
  local b = p.cal
  for i = 1, #b - 1 do
    if b[i] <= now and now < b[i + 1] then
      return b[i], b[i + 1]
    end
  end
  error('weir: the calendar window bounds sent (' .. fmt(b[1]) .. ' to ' .. fmt(b[#b]) ..
    ') do not hold the Redis clock ' .. fmt(now) .. ': instance and Redis clocks disagree by more than a window')
end

-- decision is algorithm.Decision's zero value for p.
local function decision(p)
  return {
    allowed = false, granted = 0, limit = p.cap, remaining = 0,
    retry = 0, reset = 0, delay = 0, blocked = 0, changed = false,
  }
end

-- ALG holds one table per algorithm, filled in by the algorithm files:
--   load(s, p, now)       reads the key's state into s
--   decide(p, s, now, cost, mode, apply)  mirrors the Go function of its
--                         algorithm (fixedWindow, ...); decide below adds allowed
--   save(s, pttl)         writes s with an expiry of pttl ms (see save below)
--   refund(p, s, take_now, now, g)  mirrors the Go <algorithm>Refund: gives
--                         back g events taken at take_now
--   fast(p, key, now, cost, mode, out, o)  optional: take_one of a take
--                         (cost > 0, mode EXACT or ATMOST) of a plain
--                         limit (p.plain), inlined, with no table made;
--                         it writes the decision's 8 values as put_at
--                         does and returns true, or returns false having
--                         only read (a state it leaves to the generic
--                         path, such as one in debt)
--                         The four fast paths repeat one shape on
--                         purpose: a shared helper for it costs a Lua
--                         call per decision (docs/internals.md).
local ALG = {}

-- decide mirrors algorithm.decide: the algorithm's decide, then allowed,
-- which every algorithm derives alike from what it granted.
local function decide(alg, p, s, now, cost, mode, apply)
  local d = alg.decide(p, s, now, cost, mode, apply)
  d.allowed = d.granted > 0
  return d
end

-- save writes s with a TTL of ttl µs, or deletes the key when nothing in
-- it matters any more (ttl 0): the algorithm's save writes the state
-- (through set_string or set_hash, or its own ZSET calls) and its expiry.
-- get_pair reads what set_string wrote.
local function save(alg, s, ttl)
  if ttl <= 0 then
    redis.call('DEL', s.key)
    return
  end
  alg.save(s, ms(ttl))
end

-- get_pair reads a string state "<x>:<y>" (fixed_window, gcra) as two
-- numbers, 0 and 0 when the key is absent, whether it ends in ":d" (in
-- debt: algorithm.State.Debt), and the debt's rate that may follow the
-- ":d" (a fixed window's; 0 if none).
local function get_pair(key)
  local v = redis.call('GET', key)
  if not v then
    return 0, 0, false, 0
  end
  local debt, drate = false, 0
  local j = string.find(v, ':d', 1, true)
  if j then
    debt, drate, v = true, tonumber(string.sub(v, j + 2)) or 0, string.sub(v, 1, j - 1)
  end
  local i = string.find(v, ':', 1, true)
  return tonumber(string.sub(v, 1, i - 1)), tonumber(string.sub(v, i + 1)), debt, drate
end

-- debt_suffix is what a string state in debt ends with: ":d", then the
-- debt's rate if it has one.
local function debt_suffix(s)
  if s.debt then
    if s.drate and s.drate > 0 then
      return ':d' .. fmt(s.drate)
    end
    return ':d'
  end
  return ''
end

-- set_debt_field writes a hash state's debt flag 'd' (leaky_bucket,
-- sliding_window): the debt's rate if it has one, else '1'; or removes
-- one a debit left.
local function set_debt_field(s)
  if s.debt then
    local v = '1'
    if s.drate and s.drate > 0 then
      v = fmt(s.drate)
    end
    redis.call('HSET', s.key, 'd', v)
  elseif s.had_debt then
    redis.call('HDEL', s.key, 'd')
  end
end

-- carry_rate mirrors carryRate: what a window's count over the rate pays
-- back per window, the debt's rate or p's if higher; p's without debt.
local function carry_rate(p, s)
  if s.debt then
    return max(p.rate, s.drate or 0)
  end
  return p.rate
end

-- set_debt mirrors setDebt: a window's debt flag and the debt's rate, p's
-- (none for a bucketed window).
local function set_debt(p, s, debt)
  s.debt, s.drate = debt, 0
  if debt and p.buckets == 0 then
    s.drate = p.rate
  end
end

-- The bounds of debt (algorithm/debt.go): MaxExact, MaxPeriod, MaxDebt.
local MAXEXACT, MAXPERIOD, MAXDEBT = 9007199254740992, 316224000000000, 2251799813685248

-- debt_cap_units mirrors debtCapUnits: the most a bucket holds beyond
-- empty, in units.
local function debt_cap_units(p, c)
  local m = idiv(MAXEXACT - 1 - c, 2)
  if p.b <= idiv(m, MAXPERIOD) then
    m = min(m, MAXPERIOD * p.b)
  end
  return m
end

-- debt_cap_events mirrors debtCapEvents: the most a window counts.
local function debt_cap_events(p)
  local w = idiv(MAXPERIOD, p.period) + 1
  if p.rate > idiv(MAXDEBT, w) then
    return MAXDEBT
  end
  return p.rate * w
end

-- add_capped mirrors addCapped: x + n*a, or top if that passes top.
local function add_capped(x, n, a, top)
  if n > idiv(top - x, a) then
    return top
  end
  return x + n * a
end

-- sub_floored mirrors subFloored: max(x - n*a, 0) for x >= 0.
local function sub_floored(x, n, a)
  if n >= ceil_div(x, a) then
    return 0
  end
  return x - n * a
end

-- parse_taken reads a settlement's take from its member-id argument
-- (algorithm.Taken, written by redisstore's takenArg).
local function parse_taken(id)
  local at, cost, rem = string.match(id or '', '^(%d+):(%d+):(%d+)$')
  if not at then
    error('weir: a settlement needs its take as "<at>:<cost>:<remaining>", got ' .. tostring(id))
  end
  return { at = tonumber(at), cost = tonumber(cost), rem = tonumber(rem) }
end

-- settle_room mirrors algorithm.settleRoom: how many events a bucket's
-- settlement of take t may still give back at now. Room right after the
-- take was at most x, and at most x + el*B since; what is above that up
-- to c cannot have been clipped.
local function settle_room(p, t, now)
  local c = p.burst * p.a
  local x = 0
  if t.cost < p.burst then
    x = c - t.cost * p.a
  end
  if t.rem < p.burst then
    x = min(x, t.rem * p.a + p.a - 1)
  end
  local m = x
  local el = now - t.at
  if el > 0 then
    if el >= ceil_div(c - x, p.b) then
      m = c
    else
      m = x + el * p.b
    end
  end
  return idiv(c - m, p.a)
end

-- settle mirrors algorithm.settleRefund: a settlement's refund of n events
-- of the take s.taken.
local function settle(alg, p, s, now, n)
  local t = s.taken
  if p.kind == 'token_bucket' or p.kind == 'gcra' or p.kind == 'leaky_bucket' then
    n = min(n, settle_room(p, t, now))
    if n > 0 then
      alg.credit(p, s, now, n)
    end
  elseif p.kind == 'sliding_log' then
    if t.at + p.period > now then
      alg.settle(p, s, t.at, now, n)
    end
  else
    alg.refund(p, s, t.at, now, n)
  end
end

-- set_string writes a string state with an expiry of pttl ms.
local function set_string(key, v, pttl)
  redis.call('SET', key, v, 'PX', pttl)
end

-- set_hash writes the fields of a hash state (name, value, ...) with an
-- expiry of pttl ms.
local function set_hash(key, pttl, ...)
  redis.call('HSET', key, ...)
  redis.call('PEXPIRE', key, pttl)
end

-- load reads a request's penalty box and state into a fresh s. A limit
-- without a box ignores any box on the key (algorithm.take), so its box is
-- not read. While a box that outlasts the state holds, the state is not
-- read (take answers from the box alone), unless need_state: a refund must
-- see it. s.saving says that a save follows decide whatever it decides (a
-- debit, credit, settlement or multi.lua's refund), which sliding_log and
-- concurrency need to know where their last command on the key falls.
local function load(alg, p, skey, bkey, id, now, need_state)
  -- The nil fields cost nothing but size the table's hash part for the
  -- algorithm's fields too (a constructor sizes it for the fields it
  -- names), so that load's and decide's writes find room without a rehash.
  local s = {
    key = skey, bkey = bkey, id = id, bu = 0, block_set = false, strikes = 0, last = 0, saving = need_state,
    window = nil, count = nil, level = nil, ts = nil,
  }
  if p.block > 0 then
    local b = redis.call('GET', bkey)
    if b then
      -- "<blocked_until>", or "<blocked_until>:<strikes>" with an
      -- escalating penalty's history (algorithm/penalty.go).
      local c = string.find(b, ':', 1, true)
      if c then
        s.bu, s.strikes = tonumber(string.sub(b, 1, c - 1)), tonumber(string.sub(b, c + 1))
      else
        s.bu = tonumber(b)
      end
      s.last = s.bu
    end
  end
  if p.outlasts and s.bu > now and not need_state then
    return s
  end
  alg.load(s, p, now)
  return s
end

-- start_box mirrors algorithm.startBox (penalty.go): it starts the box a
-- rejection at now earns, escalating within an escalating penalty's
-- history, and returns its length.
local function start_box(p, s, now)
  if p.forget == 0 then
    s.bu = now + p.block
    return p.block
  end
  local strikes = s.strikes
  if strikes > 0 and now >= s.last + p.forget then
    strikes = 0 -- the history is forgotten
  end
  strikes = min(strikes + 1, #p.esc) -- #p.esc: forget_after and the boxes after the first
  local box = p.block
  if strikes > 1 then
    box = p.esc[strikes]
  end
  s.bu = now + box
  s.strikes, s.last = strikes, s.bu
  s.box = box
  return box
end

-- take mirrors algorithm.take: the penalty box around decide. With commit
-- false it is algorithm.Check: nothing is consumed and no box starts.
local function take(alg, p, s, now, n, mode, commit)
  local peek = n == 0
  local cost = n
  if peek then
    cost = 1
    mode = EXACT
  end
  if s.bu ~= 0 and s.bu <= now then
    s.bu = 0 -- the penalty box has lapsed
  end
  if s.bu > now then
    local left = s.bu - now
    if p.outlasts then
      -- The box's end is later than anything the frozen state needs.
      local d = decision(p)
      d.retry, d.reset, d.blocked = left, left, s.bu
      return d
    end
    -- Blocked: still ask the algorithm when it would admit, change nothing.
    local d = decide(alg, p, s, now, cost, mode, false)
    d.allowed, d.granted, d.remaining, d.delay = false, 0, 0, 0
    d.retry = max(d.retry, left)
    d.reset = max(d.reset, left) -- nothing is usable before the box opens
    d.blocked = s.bu
    return d
  end
  commit = commit and not peek
  local d = decide(alg, p, s, now, cost, mode, commit)
  if peek then
    d.granted = 0
    d.delay = 0
  end
  if not d.allowed and commit and p.block > 0 then
    -- A rejection starts the penalty box: blocked_until = now + its length.
    local box = start_box(p, s, now)
    s.block_set = true
    d.blocked = s.bu
    d.retry = max(d.retry, box)
    d.remaining = 0
  end
  return d
end

-- persist writes what take changed: the state with a TTL equal to the
-- decision's ResetAfter, and a new penalty box with a TTL of Block.
local function persist(alg, p, s, d)
  if d.changed then
    save(alg, s, d.reset)
  end
  if s.block_set then
    if p.forget > 0 then
      -- The history lives until forget_after past the box's end.
      redis.call('SET', s.bkey, fmt(s.bu) .. ':' .. fmt(s.strikes), 'PX', ms(s.box + p.forget))
    else
      redis.call('SET', s.bkey, fmt(s.bu), 'PX', ms(s.box or p.block))
    end
  end
end

-- debt_op mirrors algorithm.debtOp (DebitTake, CreditTake): a debit
-- consumes n whether or not it fits, a credit gives n back; the reply
-- describes the state afterwards as a peek does. A debit that did not fit
-- starts the penalty box of a limit with one.
local function debt_op(alg, p, s, now, n, mode)
  if s.bu ~= 0 and s.bu <= now then
    s.bu = 0
  end
  local boxed = s.bu > now and p.block > 0
  local fit = true
  if mode == DEBIT then
    local before = alg.decide(p, s, now, 1, EXACT, false)
    fit = (not boxed) and before.remaining >= n
    alg.debit(p, s, now, n)
  elseif mode == SETTLE then
    settle(alg, p, s, now, n)
  else
    alg.credit(p, s, now, n)
  end
  local d = alg.decide(p, s, now, 1, EXACT, false)
  if d.granted > 0 then
    d.retry = 0
  end
  d.granted = 0
  if mode == DEBIT then
    d.granted = n
  end
  d.allowed = fit
  d.changed = true
  if not fit and p.block > 0 and not boxed then
    start_box(p, s, now) -- escalating, as a rejection's box is
    s.block_set = true
  end
  if mode == DEBIT and p.block > 0 and s.bu > now and d.retry > 0 and now + d.retry > s.bu then
    -- The box lasts as long as the debt (algorithm.debtOp).
    s.bu = now + d.retry
    s.box = d.retry
    s.last = s.bu
    s.block_set = true
  end
  if s.bu > now and p.block > 0 then
    local left = s.bu - now
    d.retry = max(d.retry, left)
    d.reset = max(d.reset, left)
    d.remaining = 0
    d.blocked = s.bu
  end
  return d
end

-- take_one is one whole decision, as take.lua and batch.lua make it: load
-- the state and box, decide with commit, write what changed.
local function take_one(p, skey, bkey, id, now, n, mode)
  local alg = ALG[p.kind]
  if mode >= DEBIT then
    if n > 0 then
      -- A debit or credit: it changes the state even under a box.
      local s = load(alg, p, skey, bkey, id, now, true)
      if mode == SETTLE then
        s.taken = parse_taken(id)
      end
      local d = debt_op(alg, p, s, now, n, mode)
      persist(alg, p, s, d)
      return d
    end
    mode = EXACT -- a cost of 0 peeks
  end
  local s = load(alg, p, skey, bkey, id, now, false)
  local d = take(alg, p, s, now, n, mode, true)
  persist(alg, p, s, d)
  return d
end

-- put appends d to a reply in the order decodeDecision reads it.
local function put(out, d)
  local allowed = 0
  if d.allowed then
    allowed = 1
  end
  out[#out + 1] = allowed
  out[#out + 1] = d.granted
  out[#out + 1] = d.limit
  out[#out + 1] = d.remaining
  out[#out + 1] = d.retry
  out[#out + 1] = d.reset
  out[#out + 1] = d.delay
  out[#out + 1] = d.blocked
end

-- put_at writes d's 8 values as put does, at out[i .. i+7].
local function put_at(out, i, d)
  local allowed = 0
  if d.allowed then
    allowed = 1
  end
  out[i], out[i + 1], out[i + 2], out[i + 3] = allowed, d.granted, d.limit, d.remaining
  out[i + 4], out[i + 5], out[i + 6], out[i + 7] = d.retry, d.reset, d.delay, d.blocked
end
