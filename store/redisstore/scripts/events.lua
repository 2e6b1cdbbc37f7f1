-- take_events: one decision, then its events (events.go). Only a rule
-- with events configured is decided by it; every other decision runs
-- take.lua alone, unchanged.
--
-- KEYS[1..2]  as take.lua
-- KEYS[3]     the key's event marker  <prefix>:{<key>}:evt, a hash:
--             b = the bits fired in its window (a bit per threshold,
--             1<<15 for the first refusal), e = the window's end in µs
-- KEYS[4]     the event stream        <prefix>:events
-- KEYS[5]     its sequence counter    <prefix>:events:seq, which numbers
--             every event so that a reader can count those trimmed away
-- ARGV[1..5]  as take.lua
-- ARGV[6]     the thresholds, in thousandths of the limit: "800,950,1000"
-- ARGV[7]     the rule
-- ARGV[8]     the identity: the key (weir.Key) after its rule
-- ARGV[9]     the stream's bound (XADD MAXLEN ~)
-- ARGV[10]    how a window that starts now ends: 'f' at the fixed window's
--             end (ARGV[11] its period in µs), 'r' after the decision's
--             reset_after, 'p' one period (ARGV[11]) on
-- ARGV[11]    the period in µs
--
-- Reply: take.lua's.
--
-- events_mark: the same check after a decision made elsewhere (a batch of
-- several rules, multi.lua), in a call of its own: the marker makes it
-- fire once per key, threshold and window all the same.
--
-- KEYS[1..3]  as KEYS[3..5] above
-- ARGV[1..6]  as ARGV[6..11] above
-- ARGV[7..13] the decision: allowed (1/0), granted, limit, remaining,
--             reset_after_us, now_us, n

local REFUSED = 32768

-- events_check fires what the decision {allowed, granted, limit,
-- remaining, reset_after, now} of cost n crossed. mk, stream, seq: the
-- marker, stream and counter keys; a: the settings (thresholds, rule,
-- identity, bound, end mode, period) in a[1..6].
local function events_check(mk, stream, seqkey, a, allowed, granted, limit, remaining, reset_after, now, n)
  local m = redis.call('HMGET', mk, 'b', 'e')
  local bits, wend = tonumber(m[1]) or 0, tonumber(m[2]) or 0
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
  if fire == 0 then
    return
  end
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
  redis.call('HSET', mk, 'b', bits, 'e', string.format('%d', wend))
  redis.call('PEXPIREAT', mk, string.format('%d', math.floor(wend / 1000) + 1))
  for _, f in ipairs(fired) do
    local seq = redis.call('INCR', seqkey)
    if f ~= 'r' then
      redis.call('XADD', stream, 'MAXLEN', '~', a[4], '*', 'rule', a[2], 'key', a[3],
        'kind', 'threshold', 'pm', f, 't', string.format('%d', now), 'n', seq)
    else
      redis.call('XADD', stream, 'MAXLEN', '~', a[4], '*', 'rule', a[2], 'key', a[3],
        'kind', 'refused', 't', string.format('%d', now), 'n', seq)
    end
  end
end

local function weir_take_events(KEYS, ARGV)
  local out = weir_take(KEYS, ARGV)
  events_check(KEYS[3], KEYS[4], KEYS[5], {ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]},
    out[1], out[2], out[3], out[4], out[6], out[9], tonumber(ARGV[2]))
  return out
end

local function weir_events_mark(KEYS, ARGV)
  local v = {}
  for i = 7, 13 do
    v[i] = tonumber(ARGV[i])
  end
  events_check(KEYS[1], KEYS[2], KEYS[3], ARGV, v[7], v[8], v[9], v[10], v[11], v[12], v[13])
  return {}
end
