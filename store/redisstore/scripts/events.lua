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

local REFUSED = 32768

local function weir_take_events(KEYS, ARGV)
  local out = weir_take(KEYS, ARGV)
  local allowed, granted, limit, remaining, now = out[1], out[2], out[3], out[4], out[9]
  local n = tonumber(ARGV[2])
  local m = redis.call('HMGET', KEYS[3], 'b', 'e')
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
    for pm in string.gmatch(ARGV[6], '%d+') do
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
    return out
  end
  if bits == 0 then
    local p = tonumber(ARGV[11])
    if ARGV[10] == 'f' then
      wend = (math.floor(now / p) + 1) * p
    elseif ARGV[10] == 'r' and out[6] > 0 then
      wend = now + out[6]
    else
      wend = now + p
    end
  end
  bits = bits + fire
  redis.call('HSET', KEYS[3], 'b', bits, 'e', string.format('%d', wend))
  redis.call('PEXPIREAT', KEYS[3], string.format('%d', math.floor(wend / 1000) + 1))
  for _, f in ipairs(fired) do
    local seq = redis.call('INCR', KEYS[5])
    if f ~= 'r' then
      redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[9], '*', 'rule', ARGV[7], 'key', ARGV[8],
        'kind', 'threshold', 'pm', f, 't', string.format('%d', now), 'n', seq)
    else
      redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[9], '*', 'rule', ARGV[7], 'key', ARGV[8],
        'kind', 'refused', 't', string.format('%d', now), 'n', seq)
    end
  end
  return out
end
