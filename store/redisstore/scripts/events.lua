-- take_events: one decision, then its events (events.go). Only a rule
-- with events configured is decided by it; every other decision runs
-- take.lua alone, unchanged.
--
-- KEYS[1..2]  as take.lua
-- KEYS[3]     the key's event marker  <prefix>:{<key>}:evt, a hash:
--             b = the bits fired in its window (a bit per threshold,
--             1<<15 for the first refusal), e = the window's end in µs,
--             x = the end of the penalty box whose blocked event fired and
--             whose unblocked event has not (0: none)
-- KEYS[4]     the event stream        <prefix>:events
-- KEYS[5]     its sequence counter    <prefix>:events:seq, which numbers
--             every event so that a reader can count those trimmed away
-- KEYS[6]     the penalty boxes due   <prefix>:events:due, a sorted set:
--             per key whose blocked event fired, the box's end (µs) as
--             score and "<#marker>:<marker><key>" as member, for the
--             sweeper (events_sweep in events.go) to announce its end
-- ARGV[1..5]  as take.lua
-- ARGV[6]     the thresholds, in thousandths of the limit: "800,950,1000"
-- ARGV[7]     the rule
-- ARGV[8]     the identity: the key (weir.Key) after its rule
-- ARGV[9]     the stream's bound (XADD MAXLEN ~)
-- ARGV[10]    how a window that starts now ends: 'f' at the fixed window's
--             end (ARGV[11] its period in µs), 'r' after the decision's
--             reset_after, 'p' one period (ARGV[11]) on
-- ARGV[11]    the period in µs
-- ARGV[12]    the most boxes KEYS[6] holds (events.MaxDue)
-- ARGV[13]    how long past a box's end its marker is kept, µs
--
-- Reply: take.lua's.
--
local REFUSED = 32768

local function ev_fmt(x)
  return string.format('%d', x)
end

-- ev_add appends one event to the stream: kind, threshold (pm, or nil),
-- time t; a: the settings.
local function ev_add(stream, seqkey, bound, rule, ident, kind, pm, t)
  local seq = redis.call('INCR', seqkey)
  if pm then
    redis.call('XADD', stream, 'MAXLEN', '~', bound, '*', 'rule', rule, 'key', ident,
      'kind', kind, 'pm', pm, 't', ev_fmt(t), 'n', seq)
  else
    redis.call('XADD', stream, 'MAXLEN', '~', bound, '*', 'rule', rule, 'key', ident,
      'kind', kind, 't', ev_fmt(t), 'n', seq)
  end
end

-- events_check fires what the decision {allowed, granted, limit,
-- remaining, reset_after, now, blocked} of cost n crossed, and the
-- penalty box's events (events.BoxCheck). mk, stream, seq, due: the
-- marker, stream, counter and due keys; a: the settings (thresholds,
-- rule, identity, bound, end mode, period, due bound, grace) in a[1..8].
local function events_check(mk, stream, seqkey, due, a, allowed, granted, limit, remaining, reset_after, now, n, blocked)
  local m = redis.call('HMGET', mk, 'b', 'e', 'x')
  local bits, wend, box = tonumber(m[1]) or 0, tonumber(m[2]) or 0, tonumber(m[3]) or 0
  if wend <= now then
    bits, wend = 0, 0
  end
  local after = limit - remaining
  local before = after - granted
  local fire = 0
  local fired = {}
  if granted > 0 then
    local i = 0
    for pm in string.gmatch(a[1], '%d+') do
      local need = math.max(math.floor((tonumber(pm) * limit + 999) / 1000), 1)
      local bit = 2 ^ i
      if before < need and need <= after and bits % (2 * bit) < bit then
        fire = fire + bit
        fired[#fired + 1] = pm
      end
      i = i + 1
    end
  end
  if allowed ~= 1 and n > 0 and bits < REFUSED then
    fire = fire + REFUSED
    fired[#fired + 1] = 'r'
  end
  local left, entered, moved = 0, false, false
  if box ~= 0 and box <= now then
    left, box = box, 0
  end
  if blocked > now then
    if box == 0 then
      if redis.call('ZCARD', due) < tonumber(a[7]) then
        box, entered = blocked, true
      end
    elseif blocked ~= box then
      box, moved = blocked, true
    end
  end
  if fire == 0 and left == 0 and not entered and not moved then
    return
  end
  if fire ~= 0 then
    if bits == 0 then
      local p = tonumber(a[6])
      if a[5] == 'f' then
        wend = (math.floor(now / p) + 1) * p
      elseif a[5] == 'r' and reset_after > 0 then
        wend = now + reset_after
      else
        wend = now + p
      end
    end
    bits = bits + fire
  end
  redis.call('HSET', mk, 'b', bits, 'e', ev_fmt(wend), 'x', ev_fmt(box))
  local keep = math.max(wend, now)
  if box ~= 0 then
    keep = math.max(keep, box + tonumber(a[8]))
  end
  redis.call('PEXPIREAT', mk, ev_fmt(math.floor(keep / 1000) + 1))
  local member = #mk .. ':' .. mk .. a[2] .. ':' .. a[3]
  if left ~= 0 then
    if box == 0 then
      redis.call('ZREM', due, member)
    end
    ev_add(stream, seqkey, a[4], a[2], a[3], 'unblocked', nil, left)
  end
  for _, f in ipairs(fired) do
    if f ~= 'r' then
      ev_add(stream, seqkey, a[4], a[2], a[3], 'threshold', f, now)
    else
      ev_add(stream, seqkey, a[4], a[2], a[3], 'refused', nil, now)
    end
  end
  if entered or moved then
    redis.call('ZADD', due, ev_fmt(box), member)
  end
  if entered then
    ev_add(stream, seqkey, a[4], a[2], a[3], 'blocked', nil, now)
  end
end

local function weir_take_events(KEYS, ARGV)
  local out = weir_take(KEYS, ARGV)
  events_check(KEYS[3], KEYS[4], KEYS[5], KEYS[6],
    {ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13]},
    out[1], out[2], out[3], out[4], out[6], out[9], tonumber(ARGV[2]), out[8])
  return out
end
