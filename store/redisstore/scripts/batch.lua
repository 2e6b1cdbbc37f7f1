-- batch: independent decisions of many callers in one call, each exactly
-- what take.lua would decide for it alone, in order, at one clock reading.
-- The store coalesces concurrent takes into it (batch.go). Decisions on the
-- same key see each other's writes, as consecutive calls would. scripts.go
-- puts it in the library and, after the prelude and every algorithm, in
-- the EVAL script of the same name.
--
-- KEYS[2i-1], KEYS[2i]  decision i's state and penalty-box keys
-- ARGV[1]  now in µs, or '' to read Redis TIME (the normal case)
-- ARGV[2]  L, the number of distinct compiled limits that follow
-- ARGV[3 .. 2+NLIMIT*L]  the limits, NLIMIT values each (see params)
-- then 4 values per decision: its limit's number (1..L), n, mode, member id
--
-- Reply: {now_us, then per decision its 8 values as put() writes them, in
-- an array of their own, or an error reply if that decision failed}. A
-- failure (a key of the wrong type, say) touches only its own decision:
-- the others stand, and the reply says which failed. On a replica the
-- reply is READONLY for the whole batch.

local function weir_batch(KEYS, ARGV)
  local now = clock(ARGV[1])
  local nl = tonumber(ARGV[2])
  local limits = {}
  for j = 1, nl do
    limits[j] = params(ARGV, 3 + (j - 1) * NLIMIT)
  end
  local base = 3 + nl * NLIMIT
  local out = { now }
  for i = 1, #KEYS / 2 do
    local a = base + (i - 1) * 4
    local ok, d = pcall(take_one, limits[tonumber(ARGV[a])], KEYS[2 * i - 1], KEYS[2 * i],
      ARGV[a + 3], now, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]))
    local r
    if ok then
      r = {}
      put(r, d)
    else
      -- redis.call raises a table {err = ...} in a function and may raise
      -- the bare message in an EVAL script; a bug in the Lua, a string.
      local msg = d
      if type(d) == 'table' then
        msg = d.err
      end
      msg = tostring(msg)
      if string.sub(msg, 1, 8) == 'READONLY' then
        -- A replica (an EVAL script on a demoted primary; an FCALL is
        -- refused before it runs). No decision could write, so nothing
        -- changed: answer for the whole batch, which the store retries.
        return { err = msg }
      end
      if not string.find(msg, '^%u+ ') then
        msg = 'ERR weir batch decision ' .. i .. ': ' .. msg
      end
      r = { err = msg } -- Redis's own error code first, as redis.call gave it
    end
    out[i + 1] = r
  end
  return out
end
