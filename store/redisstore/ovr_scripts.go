package redisstore

import (
	"time"

	"github.com/redis/rueidis"
)

// The override changes run as small EVAL scripts of their own, apart from
// the decision library: a change is rare, and each script does its
// check and its writes in one atomic step, so that two instances changing
// overrides at once never pass the bound nor log a change they did not
// make.
//
// KEYS[1] is the index hash, KEYS[2] the log stream, KEYS[3] the counter
// of changes, KEYS[4] the expiries the events sweeper owes (one slot: all
// are tagged {overrides}); on a server that is not a cluster, KEYS[5] is
// the exact key's override, written in the same step. On a cluster that key lives in its identity's slot: the scripts
// return the change's number, and ovrPutScript writes the key only if no
// later change of it was written first, so that the key ends as the
// index says whatever order two instances' writes arrive in.

// ovrSetScript stores an override: ARGV[1] the field (the override's
// key), ARGV[2] its JSON, ARGV[3] the bound, ARGV[4] the log's length,
// ARGV[5] the value of KEYS[5], ARGV[6] its PXAT in ms ("0": none) and
// ARGV[7] its until in µs ("0": none), the score of its expiry in KEYS[4].
// An override beyond the bound is refused ("WEIRBOUND <count>") before
// anything is written; else it returns the change's number.
var ovrSetScript = rueidis.NewLuaScript(`
local n = redis.call('HLEN', KEYS[1])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and n >= tonumber(ARGV[3]) then
  return redis.error_reply('WEIRBOUND ' .. n)
end
if KEYS[5] then
  if ARGV[6] ~= '0' then
    redis.call('SET', KEYS[5], ARGV[5], 'PXAT', ARGV[6])
  else
    redis.call('SET', KEYS[5], ARGV[5])
  end
end
if ARGV[7] ~= '0' then
  redis.call('ZADD', KEYS[4], ARGV[7], ARGV[1])
else
  redis.call('ZREM', KEYS[4], ARGV[1])
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'op', 'set', 'override', ARGV[2])
return redis.call('INCR', KEYS[3])
`)

// ovrDeleteScript removes the override ARGV[1] and logs it (ARGV[2] the
// log's length); it returns the change's number, or false if there was
// none.
var ovrDeleteScript = rueidis.NewLuaScript(`
local doc = redis.call('HGET', KEYS[1], ARGV[1])
if not doc then return false end
if KEYS[5] then redis.call('DEL', KEYS[5]) end
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'op', 'delete', 'override', doc)
return redis.call('INCR', KEYS[3])
`)

// ovrPutScript writes an exact key's override on a cluster, after the
// index: KEYS[1] the override, KEYS[2] the number of the last change
// written to it; ARGV[1] this change's number, ARGV[2] the value ("": a
// delete), ARGV[3] its PXAT in ms ("0": none), ARGV[4] how long the
// number is kept, in ms (far longer than a call may take). A change older
// than the last one written is dropped: it returns 0.
var ovrPutScript = rueidis.NewLuaScript(`
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if last >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[4])
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
elseif ARGV[3] ~= '0' then
  redis.call('SET', KEYS[1], ARGV[2], 'PXAT', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[2])
end
return 1
`)

// ovrSeqTTL is how long a cluster keeps the number of an identity's last
// override change: a change delayed longer than this (far more than any
// call's deadline) could still overwrite a later one.
const ovrSeqTTL = 10 * time.Minute
