-- release: gives back a concurrency lease. A lease of weight n is the ZSET
-- members "<lease>#1".."<lease>#n"; they are removed in chunks until one
-- is missing. Releasing an unknown or expired lease does nothing.
--
-- KEYS[1]  the concurrency state key
-- ARGV[1]  the lease id
-- Reply: {the number of slots released}.

local function weir_release(KEYS, ARGV)
  local key, id = KEYS[1], ARGV[1]
  local total, i = 0, 1
  while true do
    local args = {}
    for j = i, i + 99 do
      args[#args + 1] = id .. '#' .. string.format('%d', j)
    end
    local removed = redis.call('ZREM', key, unpack(args))
    total = total + removed
    if removed < #args then
      return { total }
    end
    i = i + 100
  end
end
