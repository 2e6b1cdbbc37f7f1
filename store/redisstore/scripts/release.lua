-- release: gives back a concurrency lease, its whole weight: the member
-- "<lease>#<w>w", w read from "<lease>#w" (absent for w = 1), and the
-- running total (see concurrency.lua). A lease an older weir took (one
-- member "<lease>#<i>" per slot) is removed member by member. Releasing an
-- unknown or expired lease does nothing.
--
-- KEYS[1]  the concurrency state key
-- ARGV[1]  the lease id
-- Reply: {the number of slots released}.

local function weir_release(KEYS, ARGV)
  local key, id = KEYS[1], ARGV[1]
  if redis.call('EXISTS', key) == 0 then
    return { 0 }
  end
  local total = lease_total(key)
  local w = 1
  local lw = redis.call('ZSCORE', key, lease_weight_member(id))
  if lw then
    w = -tonumber(lw)
  end
  local released = 0
  if redis.call('ZREM', key, lease_member(id, w)) == 1 then
    if w > 1 then
      redis.call('ZREM', key, lease_weight_member(id))
    end
    released = w
  else
    local i = 1
    while true do
      local args = {}
      for j = i, i + 99 do
        args[#args + 1] = id .. '#' .. fmt(j)
      end
      local removed = redis.call('ZREM', key, unpack(args))
      released = released + removed
      if removed < #args then
        break
      end
      i = i + 100
    end
  end
  if released > 0 then
    lease_set_total(key, total - released)
  end
  return { released }
end
