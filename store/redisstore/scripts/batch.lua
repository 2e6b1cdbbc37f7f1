-- batch: independent decisions of many callers in one call, each exactly
-- what take.lua would decide for it alone, in order, at one clock reading.
-- The store coalesces concurrent takes into it (batch.go). Decisions on the
-- same key see each other's writes, as consecutive calls would. scripts.go
-- puts it in the library and, after the prelude and every algorithm, in
-- the EVAL script of the same name.
--
-- KEYS[2i-1], KEYS[2i]  decision i's state and penalty-box keys
-- KEYS[2N+1]  optional (an odd count of keys): the index of overrides
--             (override.go), sent when the limits read overrides (p.ovr).
--             While it does not exist no key has an override, and the
--             batch reads none (one EXISTS instead of a GET per decision).
--             Where it lives in the decisions' Redis, an exact key's
--             override is written and deleted in the same script as its
--             index field (ovr_scripts.go), so the key exists only while
--             the index does.
-- ARGV[1]  now in µs, or '' to read Redis TIME (the normal case)
-- ARGV[2]  L, the number of distinct compiled limits that follow
-- ARGV[3 .. 2+L]  the limits, each packed in one value (see limit_of)
-- then 4 values per decision: its limit's number (1..L), n, mode, member id
--
-- Reply: {now_us, then per decision its 8 values as put() writes them}, one
-- flat array (an array per decision costs Redis a table and its reply
-- header each). A decision that failed has an error reply in place of its
-- first value and 0 in the other seven: a failure (a key of the wrong
-- type, say) touches only its own decision; the others stand, and the
-- reply says which failed. On a replica the reply is READONLY for the
-- whole batch.

-- nbatch is the same for the decisions a Redis Cluster node owns, whatever
-- their slots (batch.go's node queues send it to one node): its keys are
-- not declared, since Redis refuses declared keys of several slots
-- (CROSSSLOT) whatever a function's flags; the library registers it with
-- the flag allow-cross-slot-keys, which lets it touch undeclared keys of
-- every slot the node serves.
--
-- ARGV[1]  K, the number of keys (2 per decision)
-- ARGV[2 .. K+1]  the keys, as batch's KEYS
-- then batch's ARGV
--
-- A decision must run whole or not at all. Every keyed command of a
-- decision names a key of its one slot. Where that slot is stable (no
-- migration under way on this node), Redis checks each command against the
-- slot's owner: if the node does not serve it, or the cluster is down, the
-- decision's first command already fails, having changed nothing, and so
-- does the decision. Within a migrating slot that is not so: Redis refuses
-- a command there only if one of its keys is missing, which a decision can
-- meet after it has written. So for decisions of an algorithm not in
-- GUARDED (below) nbatch first asks CLUSTER NODES whether any
-- slot of this node is migrating or importing ('[' in the reply; it costs
-- Redis about as much as 14 probes, so a call of fewer than 16 such
-- decisions probes them all instead); if one is, each decision first probes its
-- slot: EXISTS on a key of the same slot that no one writes (the
-- penalty-box key and '?'), which fails in a slot migrating away (the probe key is missing: ASK), in a slot being imported
-- (no ASKING: MOVED) and wherever the first command would. A decision that
-- fails either way was not made; its reply is an error beginning
-- WEIRNOTLOCAL, and the store sends it again alone through the cluster
-- client, which follows the redirection. A script runs atomically, so
-- nothing moves while it runs.
--
-- The algorithms in GUARDED (today all seven; the question and the probe
-- stay for one that is not) need neither: their decisions are safe in a
-- migrating slot as they are.
-- In such a slot a command fails exactly when one of its keys is missing
-- (on the node it migrates from: ASK; on the importing node every keyed
-- command fails, as everywhere the node does not serve the slot), and a
-- script's clock and keys stand still while it runs, so a key a command
-- found stays there until one of the decision's own commands deletes it
-- (DEL, or removing the last member of a ZSET or field of a hash). A
-- guarded algorithm's decision (take, peek, debit, credit or settle) sends
-- no write before it has read every key it will write or delete: load
-- reads the penalty box first (when the limit has one; a box is written
-- only then), then the state (GET, HMGET, or for sliding_log a ZRANGE and
-- for concurrency a ZSCORE); every later command names one of those keys,
-- and no command empties the state before the decision's last command on
-- it, which is followed at most by the box's SET. (A plain take's fast
-- path, ALG.x.fast, sends the same commands in the same order: the
-- state's read, then its write or its DEL; where it reads with SET NX GET,
-- that command writes only a key it found absent, and on a missing key in
-- a migrating slot it fails before writing, as a read would.) For the string and hash
-- states the only delete is save's DEL of the state (or warmup's). A
-- sliding_log or concurrency decision keeps its ZSET from emptying on the
-- way: load drops members that left the window or expired only when one
-- stays (the newest entry, a live lease: "#t" stays); when none does, they
-- stay until decide has added its own member and then go, or go as
-- decide's last command (or save's DEL); a credit or settlement adds a
-- member's remainder before removing the member and leaves the log's last
-- member to save's DEL; a rewrite of old-form members adds before it
-- removes (sliding_log.lua, concurrency.lua). So a decision that reaches
-- its first write runs whole, and one that would meet a missing key fails
-- at a read, before any write. (concurrency has no debt: the store refuses
-- debits, refunds and settlements for it.) An algorithm file that changes
-- its commands must keep this true or leave the table.

-- GUARDED names the algorithms whose decisions need no migration check
-- (see above).
local GUARDED = {
  fixed_window = true, gcra = true, token_bucket = true,
  leaky_bucket = true, sliding_window = true, sliding_log = true,
  concurrency = true,
}

-- ZEROS holds zeros to size a batch's reply table with (batch_run).
local ZEROS = {}

-- batch_run makes the decisions whose keys are K[ko+1 ..] (2 each, nk in
-- all) and whose other arguments are A[ao+1 ..], laid out as batch's ARGV.
-- index, if not nil, is the index of overrides (see KEYS above).
local function batch_run(K, ko, nk, A, ao, probe, index)
  nxget()
  local now = clock(A[ao + 1])
  -- ovr: whether a key may have an override; asked of index at the first
  -- decision whose limit reads overrides.
  local ovr = index == nil
  local nl = SMALL[A[ao + 2]] or tonumber(A[ao + 2])
  local limits = {}
  for j = 1, nl do
    limits[j] = limit_of(A[ao + 2 + j])
  end
  local base = ao + 3 + nl
  local out
  local nv = 4 * nk -- 8 values per decision
  if nv <= 4000 then
    -- Sized at once: filling a table from { now } rehashes it each time
    -- its size doubles. The constructor takes unpack's values in one
    -- piece (Lua's stack allows some 8000 of them).
    for j = #ZEROS + 1, nv do
      ZEROS[j] = 0
    end
    out = { now, unpack(ZEROS, 1, nv) }
  else
    out = { now }
  end
  local careful, probed = false, nil
  if probe then
    -- Only the decisions of unguarded algorithms need the check.
    local unguarded = 0
    for i = 1, nk / 2 do
      if not GUARDED[limits[tonumber(A[base + (i - 1) * 4])].kind] then
        unguarded = unguarded + 1
      end
    end
    if unguarded >= 16 then
      local ok, nodes = pcall(redis.call, 'CLUSTER', 'NODES')
      careful = not ok or type(nodes) ~= 'string' or string.find(nodes, '[', 1, true) ~= nil
    else
      careful = unguarded > 0 -- fewer probes than CLUSTER NODES costs (~14 probes)
    end
    if careful then
      probed = {}
    end
  end
  for i = 1, nk / 2 do
    local a = base + (i - 1) * 4
    local o = 2 + (i - 1) * 8 -- the decision's first value in out
    local skey, bkey = K[ko + 2 * i - 1], K[ko + 2 * i]
    local li, n, mode = A[a], A[a + 1], A[a + 2]
    local p = limits[SMALL[li] or tonumber(li)]
    local refused
    if careful and not GUARDED[p.kind] then
      refused = probed[bkey]
      if refused == nil then
        local r = redis.pcall('EXISTS', bkey .. '?')
        refused = false
        if type(r) == 'table' and r.err then
          refused = 'WEIRNOTLOCAL not run: ' .. tostring(r.err)
        end
        probed[bkey] = refused
      end
    end
    local msg
    if refused then
      msg = refused
    else
      n, mode = SMALL[n] or tonumber(n), SMALL[mode] or tonumber(mode)
      local ok, d = true, false
      if p.ovr and index then
        ovr = redis.call('EXISTS', index) == 1
        index = nil
      end
      if p.ovr and ovr then
        local maxcost
        ok, d, maxcost = pcall(override_of, p, bkey, now)
        if ok then
          p = d
          ok, d = pcall(override_cost, maxcost, n, mode)
          if ok then
            n, d = d, false
          end
        end
      end
      if ok and p.plain and mode and n and mode <= ATMOST and n > 0 then
        -- A plain take: the algorithm's fast path, if it has one, makes
        -- it whole or reads only and leaves it to take_one.
        local fast = ALG[p.kind].fast
        if fast then
          ok, d = pcall(fast, p, skey, now, n, mode, out, o)
        end
      end
      if ok and not d then
        ok, d = pcall(take_one, p, skey, bkey, A[a + 3], now, n, mode)
        if ok then
          put_at(out, o, d)
        end
      end
      if not ok then
        -- redis.call raises a table {err = ...} in a function and may raise
        -- the bare message in an EVAL script; a bug in the Lua, a string.
        msg = d
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
        if probe and (string.find(msg, 'non local key', 1, true) or string.find(msg, 'cluster is down', 1, true)) then
          -- Refused at the decision's first command: nothing of it ran.
          msg = 'WEIRNOTLOCAL not run: ' .. msg
        elseif not string.find(msg, '^%u+ ') then
          msg = 'ERR weir batch decision ' .. i .. ': ' .. msg
        end
      end
    end
    if msg then
      -- Redis's own error code first, as redis.call gave it
      out[o], out[o + 1], out[o + 2], out[o + 3] = { err = msg }, 0, 0, 0
      out[o + 4], out[o + 5], out[o + 6], out[o + 7] = 0, 0, 0, 0
    end
  end
  return out
end

local function weir_batch(KEYS, ARGV)
  local nk = #KEYS
  if nk % 2 == 1 then
    return batch_run(KEYS, 0, nk - 1, ARGV, 0, false, KEYS[nk])
  end
  return batch_run(KEYS, 0, nk, ARGV, 0, false, nil)
end

local function weir_nbatch(KEYS, ARGV)
  local nk = tonumber(ARGV[1])
  return batch_run(ARGV, 1, nk, ARGV, 1 + nk, true)
end

-- weir_limits answers how many parsed limits the library holds (limit_of's
-- cache; tests check its bound). It reads no key.
local function weir_limits(KEYS, ARGV)
  return cached_limits()
end
