package server

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/keys"
	"github.com/weir-dev/weir/policy"
)

// Spend ranking (GET /v1/spend): the settled cost per identity of each
// rule over the rule's current period (a calendar budget's month, week
// or day in its zone; otherwise the window of its period, aligned to the
// epoch as fixed windows are).
//
// Each instance adds its settlements to a space-saving sketch of
// spendCap identities per rule. Without Redis that sketch is the answer
// (per instance). With Redis, every instance adds its sketch to a sorted
// set per rule and period, <prefix>:spend:{rule:start} (its errors in a
// hash beside it, in the same slot), every spendEvery (one second) and on
// shutdown, in one script per rule that applies the same space-saving
// rule: at most spendCap members, the lowest one giving its place (and
// its count, as the newcomer's error) to a newcomer. Both keys expire at
// the period's end. An answer adds up the set and this instance's
// settlements not yet flushed, so it misses at most the other instances'
// settlements of their last flush interval (and those of a flush in
// flight); a flush that fails is merged back and retried.
const spendCap = 1024

// spendPeriod is one period of a rule, in µs since the epoch, and the
// zone its bounds are shown in.
type spendPeriod struct {
	start, end int64
	loc        *time.Location
}

// spendPeriodOf returns the period of l holding now.
func spendPeriodOf(l weir.Limit, now time.Time) (spendPeriod, error) {
	p, err := l.Compile()
	if err != nil {
		return spendPeriod{}, err
	}
	us := now.UnixMicro()
	if p.IsCalendar() {
		b := algorithm.CalendarBounds(&p, us)
		loc := p.Location
		if loc == nil {
			loc = time.UTC
		}
		return spendPeriod{start: b[1], end: b[2], loc: loc}, nil
	}
	if p.Period <= 0 {
		return spendPeriod{}, fmt.Errorf("its limit has no period to rank spend in")
	}
	start := us / p.Period * p.Period
	if us < 0 && us%p.Period != 0 {
		start -= p.Period
	}
	return spendPeriod{start: start, end: start + p.Period, loc: time.UTC}, nil
}

// json returns the period as GET /v1/spend shows it.
func (p spendPeriod) json() map[string]string {
	f := func(us int64) string { return time.UnixMicro(us).In(p.loc).Format(time.RFC3339Nano) }
	return map[string]string{"start": f(p.start), "end": f(p.end)}
}

// spendSketch is one rule's settlements in one period.
type spendSketch struct {
	per spendPeriod
	tk  *TopK
}

// spendBook holds each rule's sketch of its current period.
type spendBook struct {
	mu sync.Mutex
	m  map[string]*spendSketch
}

func newSpendBook() *spendBook { return &spendBook{m: map[string]*spendSketch{}} }

// add records w settled by identity under rule in period per, of which
// up to e may be an overestimate. A rule's sketch follows its latest
// period: a settlement in an earlier one than the sketch's is dropped
// (the ranking shows the current period), a later one starts afresh.
func (b *spendBook) add(rule, identity string, per spendPeriod, w, e int64) {
	identity = keys.ShortIdentity(identity)
	// Under b.mu, so that a flush's take never leaves an add behind in
	// the sketch it has just read.
	b.mu.Lock()
	defer b.mu.Unlock()
	sk := b.m[rule]
	switch {
	case sk != nil && per.start < sk.per.start:
		return
	case sk == nil || per.start > sk.per.start:
		sk = &spendSketch{per: per, tk: NewTopK(spendCap)}
		b.m[rule] = sk
	}
	sk.tk.addUncertain(identity, w, e)
}

// top returns rule's sketch entries of period per, heaviest first.
func (b *spendBook) top(rule string, per spendPeriod) []TopEntry {
	b.mu.Lock()
	sk := b.m[rule]
	b.mu.Unlock()
	if sk == nil || sk.per.start != per.start {
		return nil
	}
	return sk.tk.Top(0)
}

// take removes every sketch and returns them (a flush).
func (b *spendBook) take() map[string]*spendSketch {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.m
	b.m = map[string]*spendSketch{}
	return m
}

// retain drops the sketches of rules not in keep.
func (b *spendBook) retain(keep map[string]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for rule := range b.m {
		if !keep[rule] {
			delete(b.m, rule)
		}
	}
}

// spendPeriod returns rule's current period under p.
func (s *Server) spendPeriod(p *policy.Policy, rule string) (spendPeriod, error) {
	l, err := p.Limit(rule, "")
	if err != nil {
		return spendPeriod{}, err
	}
	per, err := spendPeriodOf(l, s.now())
	if err != nil {
		return spendPeriod{}, fmt.Errorf("rule %q: %w", rule, err)
	}
	return per, nil
}

// spendKeys returns the sorted set and the error hash of rule's period
// starting at start (µs): one hash tag, so one slot.
func (s *Server) spendKeys(rule string, start int64) (string, string) {
	k := s.keys.spend + "{" + rule + ":" + strconv.FormatInt(start, 10) + "}"
	return k, k + ":err"
}

// spendFlushScript adds ARGV[3..] (member, count, error triples) to the
// sorted set KEYS[1] and the error hash KEYS[2], keeping at most ARGV[1]
// members by space-saving, and makes both expire at ARGV[2] (ms).
var spendFlushScript = rueidis.NewLuaScript(`
local cap = tonumber(ARGV[1])
for i = 3, #ARGV, 3 do
  local m, c, e = ARGV[i], tonumber(ARGV[i+1]), tonumber(ARGV[i+2])
  if redis.call('ZSCORE', KEYS[1], m) then
    redis.call('ZINCRBY', KEYS[1], c, m)
    if e > 0 then redis.call('HINCRBY', KEYS[2], m, e) end
  elseif redis.call('ZCARD', KEYS[1]) < cap then
    redis.call('ZADD', KEYS[1], c, m)
    if e > 0 then redis.call('HSET', KEYS[2], m, e) end
  else
    local low = redis.call('ZPOPMIN', KEYS[1])
    local lc = tonumber(low[2])
    redis.call('HDEL', KEYS[2], low[1])
    redis.call('ZADD', KEYS[1], lc + c, m)
    redis.call('HSET', KEYS[2], m, lc + e)
  end
end
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
redis.call('PEXPIREAT', KEYS[2], ARGV[2])
return 1
`)

// spendReadScript returns member, count, error triples: the ARGV[1]
// heaviest of KEYS[1], then those of ARGV[2..] it also holds.
var spendReadScript = rueidis.NewLuaScript(`
local out, seen = {}, {}
local function put(m, c)
  seen[m] = true
  out[#out+1] = m
  out[#out+1] = c
  out[#out+1] = redis.call('HGET', KEYS[2], m) or '0'
end
local top = redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #top, 2 do put(top[i], top[i+1]) end
for i = 2, #ARGV do
  local m = ARGV[i]
  if not seen[m] then
    local c = redis.call('ZSCORE', KEYS[1], m)
    if c then put(m, c) end
  end
end
return out
`)

// spendLoop flushes this instance's settlements to Redis every
// spendEvery until ctx ends.
func (s *Server) spendLoop(ctx context.Context) {
	s.redisLoop(ctx, s.o.spendEvery, false, s.flushSpend,
		"weir: adding settlements to the fleet's spend ranking in Redis failed; kept and retried",
		"weir: adding settlements to the fleet's spend ranking in Redis works again")
}

// flushSpend adds this instance's sketches to Redis. What a failed call
// did not add is merged back into the book, to be sent next time.
func (s *Server) flushSpend(ctx context.Context) error {
	if s.rdb == nil {
		return nil
	}
	var first error
	for rule, sk := range s.spend.take() {
		es := sk.tk.Top(0)
		if len(es) == 0 {
			continue
		}
		if first == nil {
			args := make([]string, 0, 2+3*len(es))
			args = append(args, strconv.Itoa(spendCap), strconv.FormatInt(sk.per.end/1000, 10))
			for _, e := range es {
				args = append(args, e.Identity, strconv.FormatInt(e.Count, 10), strconv.FormatInt(e.Error, 10))
			}
			z, h := s.spendKeys(rule, sk.per.start)
			cctx, cancel := context.WithTimeout(ctx, s.storeTimeout())
			err := spendFlushScript.Exec(cctx, s.rdb, []string{z, h}, args).Error()
			cancel()
			if err == nil {
				continue
			}
			first = err
		}
		for _, e := range es {
			s.spend.add(rule, e.Identity, sk.per, e.Count, e.Error)
		}
	}
	return first
}

// storeTimeout is the deadline of the service's own Redis calls.
func (s *Server) storeTimeout() time.Duration {
	if s.redis != nil {
		return max(s.redis.Timeout(), time.Second)
	}
	return 2 * time.Second
}

// spendTop returns rule's n heaviest spenders in period per: this
// instance's sketch, added to the fleet's sorted set on Redis.
func (s *Server) spendTop(ctx context.Context, rule string, per spendPeriod, n int) ([]TopEntry, error) {
	local := s.spend.top(rule, per)
	if s.rdb == nil {
		if len(local) > n {
			local = local[:n]
		}
		return local, nil
	}
	args := make([]string, 0, 1+len(local))
	args = append(args, strconv.Itoa(n))
	for _, e := range local {
		args = append(args, e.Identity)
	}
	z, h := s.spendKeys(rule, per.start)
	ctx, cancel := context.WithTimeout(ctx, s.storeTimeout())
	defer cancel()
	vals, err := spendReadScript.Exec(ctx, s.rdb, []string{z, h}, args).AsStrSlice()
	if err != nil && !rueidis.IsRedisNil(err) {
		return nil, fmt.Errorf("%w: reading the spend ranking: %w", weir.ErrStore, err)
	}
	sum := make(map[string]*TopEntry, len(vals)/3+len(local))
	for i := 0; i+2 < len(vals); i += 3 {
		c, err1 := strconv.ParseFloat(vals[i+1], 64)
		e, err2 := strconv.ParseInt(vals[i+2], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: the spend ranking holds %q, %q", weir.ErrStore, vals[i+1], vals[i+2])
		}
		sum[vals[i]] = &TopEntry{Identity: vals[i], Count: int64(c), Error: e}
	}
	for _, e := range local {
		if t := sum[e.Identity]; t != nil {
			t.Count += e.Count
			t.Error += e.Error
		} else {
			sum[e.Identity] = &TopEntry{Identity: e.Identity, Count: e.Count, Error: e.Error}
		}
	}
	out := make([]TopEntry, 0, len(sum))
	for _, e := range sum {
		out = append(out, *e)
	}
	sortEntries(out)
	if len(out) > n {
		out = out[:n]
	}
	return out, nil
}
