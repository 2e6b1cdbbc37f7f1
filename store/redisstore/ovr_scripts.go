package redisstore

import "github.com/redis/rueidis"

// The override changes run as small EVAL scripts of their own, apart from
// the decision library: a change is rare, and each script does its
// check and its writes in one atomic step, so that two instances changing
// overrides at once never pass the bound nor log a change they did not
// make.
//
// KEYS[1] is the index hash, KEYS[2] the log stream (one slot: both are
// tagged {overrides}); on a server that is not a cluster, KEYS[3] is the
// exact key's override, written in the same step.

// ovrSetScript stores an override: ARGV[1] the field (the override's
// key), ARGV[2] its JSON, ARGV[3] the bound, ARGV[4] the log's length,
// ARGV[5] the value of KEYS[3] and ARGV[6] its PXAT in ms ("0": none).
// An override beyond the bound is refused ("WEIRBOUND <count>") before
// anything is written.
var ovrSetScript = rueidis.NewLuaScript(`
local n = redis.call('HLEN', KEYS[1])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and n >= tonumber(ARGV[3]) then
  return redis.error_reply('WEIRBOUND ' .. n)
end
if KEYS[3] then
  if ARGV[6] ~= '0' then
    redis.call('SET', KEYS[3], ARGV[5], 'PXAT', ARGV[6])
  else
    redis.call('SET', KEYS[3], ARGV[5])
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'op', 'set', 'override', ARGV[2])
return n
`)

// ovrDeleteScript removes the override ARGV[1] and logs it (ARGV[2] the
// log's length); it returns the override's JSON, or false if there was
// none.
var ovrDeleteScript = rueidis.NewLuaScript(`
local doc = redis.call('HGET', KEYS[1], ARGV[1])
if not doc then return false end
if KEYS[3] then redis.call('DEL', KEYS[3]) end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'op', 'delete', 'override', doc)
return doc
`)
