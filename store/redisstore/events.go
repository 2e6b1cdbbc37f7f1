package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/events"
)

// Events (internal/events): a decision on a key whose rule has events
// runs events.lua, which decides as take.lua does and then, in the same
// atomic step, makes the crossing check against the key's marker, the
// hash "<prefix>:{<tag>}:evt" (in the slot of the key's state, expiring
// with its window), and appends what fires to the stream
// "<prefix>:events", capped at about events.DefaultBound entries (XADD
// MAXLEN ~). "<prefix>:events:seq" numbers the events. So each crossing
// is recorded once per key, threshold and window whichever instance
// decided. Every other decision runs take.lua unchanged, and a store
// without event rules pays one atomic load.
//
// The stream is one key, so events need a single Redis (or Sentinel):
// on a Cluster, SetEventRules fails with weir.ErrUnsupported. Decisions
// of several requests at once (Do with a batch, multi.lua) record their
// events in the batch's own script call, after its decisions.

func init() {
	events.Register(func(x any) events.Store {
		if s, ok := x.(*Store); ok {
			return eventsOf{s}
		}
		return nil
	})
}

// eventsOf is a Store's events.Store (events.Of finds it).
type eventsOf struct{ s *Store }

// SetEventRules implements events.Store.
func (e eventsOf) SetEventRules(rules map[string]events.Rule) error { return e.s.setEventRules(rules) }

// Sweep implements events.Store.
func (e eventsOf) Sweep(ctx context.Context) (int, error) { return e.s.sweep(ctx) }

// Events implements events.Store.
func (e eventsOf) Events(ctx context.Context, since string, n int) ([]events.Event, error) {
	return e.s.events(ctx, since, n)
}

// evState is the store's event rules, replaced whole.
type evState struct {
	rules map[string]redisEvRule
}

// names returns the rules as events.Sorted takes them.
func (e *evState) names() map[string]events.Rule {
	m := make(map[string]events.Rule, len(e.rules))
	for n, r := range e.rules {
		m[n] = r.rule
	}
	return m
}

type redisEvRule struct {
	rule events.Rule
	arg  string // the thresholds as events.lua reads them
}

func (s *Store) evStream() string { return s.prefix + ":events" }

// setEventRules implements events.Store.
func (s *Store) setEventRules(rules map[string]events.Rule) error {
	if err := events.CheckRules(rules); err != nil {
		return err
	}
	if len(rules) == 0 {
		s.evts.Store(nil)
		return nil
	}
	if s.cluster || s.conn.clusterAsked {
		return fmt.Errorf("%w: events need one Redis, not a Cluster", weir.ErrUnsupported)
	}
	st := &evState{rules: make(map[string]redisEvRule, len(rules))}
	for name, r := range rules {
		r.Thresholds = append([]float64(nil), r.Thresholds...)
		st.rules[name] = redisEvRule{rule: r, arg: r.Arg()}
	}
	s.evts.Store(st)
	return nil
}

// evArgs are events.lua's settings of a decision under c on key: the
// thresholds, rule, identity, bound, how its window ends and the period.
func (s *Store) evArgs(c *compiled, key, rule string, r *redisEvRule) []string {
	end := "p"
	switch {
	case c.p.Kind == algorithm.FixedWindow && c.p.Calendar == 0:
		end = "f"
	case c.p.Kind == algorithm.FixedWindow:
		end = "r"
	}
	return []string{r.arg, rule, events.IdentityOf(key), strconv.Itoa(events.DefaultBound), end, strconv.FormatInt(c.p.Period, 10),
		strconv.Itoa(events.MaxDue), strconv.FormatInt(events.Grace.Microseconds(), 10)}
}

// evKeys are the marker, stream, counter and due keys of a key's events.
func (s *Store) evKeys(k keyNames) []string {
	return []string{s.evMarker(k.tag), s.evStream(), s.evStream() + ":seq", s.evDue()}
}

// evMarker is the event marker of the key whose hash tag is tag.
func (s *Store) evMarker(tag string) string { return s.prefix + ":{" + tag + "}:evt" }

// evDue is the sorted set of the penalty boxes whose end the sweeper owes.
func (s *Store) evDue() string { return s.evStream() + ":due" }

// ovrDue is the sorted set of the overrides whose expiry the sweeper
// owes (score: until in µs; member: the override's key), in the
// overrides' slot and written by their scripts.
func (s *Store) ovrDue() string { return s.prefix + ":{overrides}:due" }

// takeEvents is takeAlone for a key whose rule r has events.
func (s *Store) takeEvents(ctx context.Context, c *compiled, k keyNames, key, rule string, r *redisEvRule, n int64, mode algorithm.Mode, id string) ([9]int64, error) {
	keys := append([]string{k.state, k.block}, s.evKeys(k)...)
	args := append([]string{s.nowArg(), strconv.FormatInt(n, 10), modeArg(mode), id, s.argOf(c)}, s.evArgs(c, key, rule, r)...)
	var buf [9]int64
	vals, err := s.eval(ctx, &eventRoutines[c.p.Kind], keys, args, buf[:0])
	if err == nil && len(vals) != 9 {
		err = fmt.Errorf("unexpected reply of %d values", len(vals))
	}
	if err != nil {
		return [9]int64{}, err
	}
	return buf, nil
}

// events implements events.Store.
func (s *Store) events(ctx context.Context, since string, n int) ([]events.Event, error) {
	start := "-"
	if since != "" {
		if !validStreamID(since) {
			return nil, fmt.Errorf("%w: %q", events.ErrSince, since)
		}
		start = "(" + since
	}
	n = min(max(n, 0), events.MaxList)
	if n == 0 {
		return nil, nil
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	es, err := s.client.Do(ctx, s.client.B().Xrange().Key(s.evStream()).Start(start).End("+").Count(int64(n)).Build()).AsXRange()
	if err != nil {
		return nil, fmt.Errorf("%w: events: %w", weir.ErrStore, err)
	}
	return decodeEvents(es), nil
}

// decodeEvents reads stream entries that events.lua wrote.
func decodeEvents(es []rueidis.XRangeEntry) []events.Event {
	out := make([]events.Event, 0, len(es))
	for _, e := range es {
		f := e.FieldValues
		ev := events.Event{ID: e.ID, Rule: f["rule"], Key: f["key"], Kind: f["kind"]}
		t, _ := strconv.ParseInt(f["t"], 10, 64)
		ev.Time = time.UnixMicro(t).UTC()
		if pm, err := strconv.ParseInt(f["pm"], 10, 64); err == nil {
			ev.Threshold = float64(pm) / 1000
		}
		ev.Seq, _ = strconv.ParseUint(f["n"], 10, 64)
		out = append(out, ev)
	}
	return out
}

// validStreamID reports whether id reads as a stream ID "<ms>-<seq>".
func validStreamID(id string) bool {
	ms, seq, ok := strings.Cut(id, "-")
	if !ok {
		return false
	}
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return err1 == nil && err2 == nil
}

// evGroup is the consumer group of the event stream that weir serve's
// instances share: each event is delivered by one of them.
const evGroup = "weir"

// evIdle is how long an event may wait claimed by an instance before
// another takes it over (the first crashed, or hangs on a receiver).
const evIdle = time.Minute

// Group implements events.Grouped.
func (e eventsOf) Group(consumer string) events.Source {
	return &groupSource{s: e.s, consumer: consumer}
}

// groupSource reads the event stream through the consumer group: XAUTOCLAIM
// first takes over events another consumer claimed and left unacknowledged
// past evIdle (its own, after a restart under the same name, too), then
// XREADGROUP reads new ones; Ack is XACK.
type groupSource struct {
	s        *Store
	consumer string
	made     bool
}

// Claim implements events.Source.
func (g *groupSource) Claim(ctx context.Context, n int) ([]events.Event, error) {
	s := g.s
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if !g.made {
		// From "0": the first instance ever delivers what the stream keeps.
		err := s.client.Do(ctx, s.client.B().XgroupCreate().Key(s.evStream()).Group(evGroup).Id("0").Mkstream().Build()).Error()
		if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
			return nil, fmt.Errorf("%w: events group: %w", weir.ErrStore, err)
		}
		g.made = true
	}
	arr, err := s.client.Do(ctx, s.client.B().Xautoclaim().Key(s.evStream()).Group(evGroup).Consumer(g.consumer).
		MinIdleTime(strconv.FormatInt(evIdle.Milliseconds(), 10)).Start("0").Count(int64(n)).Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("%w: events claim: %w", weir.ErrStore, err)
	}
	if len(arr) >= 2 {
		if es, err := arr[1].AsXRange(); err == nil && len(es) > 0 {
			return decodeEvents(es), nil
		}
	}
	res, err := s.client.Do(ctx, s.client.B().Xreadgroup().Group(evGroup, g.consumer).Count(int64(n)).Streams().Key(s.evStream()).Id(">").Build()).AsXRead()
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: events read: %w", weir.ErrStore, err)
	}
	return decodeEvents(res[s.evStream()]), nil
}

// Ack implements events.Source.
func (g *groupSource) Ack(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	s := g.s
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if err := s.client.Do(ctx, s.client.B().Xack().Key(s.evStream()).Group(evGroup).Id(ids...).Build()).Error(); err != nil {
		return fmt.Errorf("%w: events ack: %w", weir.ErrStore, err)
	}
	return nil
}

// sweepBatch is the most penalty boxes and overrides one sweep claims.
const sweepBatch = 1000

// sweepScript claims what fell due and records its events, in one atomic
// step: KEYS[1] the boxes due (evDue), KEYS[2] the stream, KEYS[3] its
// counter, KEYS[4] the overrides due (ovrDue); ARGV[1] now in µs ("":
// Redis TIME), ARGV[2] the most to claim, ARGV[3] the stream's bound,
// ARGV[4] the rules with events, "\n"-separated. Each member is removed
// as it is read, so two instances sweeping at once never claim one
// twice. A box's unblocked event fires only if its marker still names
// that box's end (a decision after it ended, or a reset, announced it
// already; debt that extended it moved its score). An override's
// override_expired event fires if its rule has events. It returns how
// many events it recorded.
var sweepScript = rueidis.NewLuaScript(`
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local max, bound = tonumber(ARGV[2]), ARGV[3]
local rules = {}
for r in string.gmatch(ARGV[4], '[^\n]+') do
  rules[r] = true
end
local fired = 0
local function add(key, kind, t)
  local c = string.find(key, ':', 1, true)
  local rule, ident = key, ''
  if c then
    rule, ident = string.sub(key, 1, c - 1), string.sub(key, c + 1)
  end
  if kind ~= 'unblocked' and not rules[rule] then
    return
  end
  local seq = redis.call('INCR', KEYS[3])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', bound, '*', 'rule', rule, 'key', ident,
    'kind', kind, 't', string.format('%d', t), 'n', seq)
  fired = fired + 1
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, max)
for i = 1, #due, 2 do
  local member, at = due[i], tonumber(due[i + 1])
  redis.call('ZREM', KEYS[1], member)
  local c = string.find(member, ':', 1, true)
  local l = tonumber(string.sub(member, 1, c - 1))
  local mk = string.sub(member, c + 1, c + l)
  local x = tonumber(redis.call('HGET', mk, 'x') or '0')
  if x == at then
    redis.call('HSET', mk, 'x', 0)
    add(string.sub(member, c + l + 1), 'unblocked', at)
  end
end
due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'WITHSCORES', 'LIMIT', 0, max)
for i = 1, #due, 2 do
  redis.call('ZREM', KEYS[4], due[i])
  add(due[i], 'override_expired', tonumber(due[i + 1]))
end
return fired
`)

// sweep implements events.Store: one sweepScript call.
func (s *Store) sweep(ctx context.Context) (int, error) {
	if s.cluster || s.conn.clusterAsked {
		return 0, nil // events are refused on a Cluster
	}
	var rules []string
	if e := s.evts.Load(); e != nil {
		rules = events.Sorted(e.names())
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	n, err := sweepScript.Exec(ctx, s.client, []string{s.evDue(), s.evStream(), s.evStream() + ":seq", s.ovrDue()},
		[]string{s.nowArg(), strconv.Itoa(sweepBatch), strconv.Itoa(events.DefaultBound), strings.Join(rules, "\n")}).AsInt64()
	if err != nil {
		return 0, fmt.Errorf("%w: events sweep: %w", weir.ErrStore, err)
	}
	return int(n), nil
}

// resetScript is reset for a key whose marker may name a box: it deletes
// the state, box and marker (KEYS[1..3]) and, if the marker named a box,
// records its unblocked event at now (or the box's end, if earlier) and
// drops it from the boxes due. KEYS[4..6] the stream, counter and boxes
// due; ARGV[1] now ("" for TIME), ARGV[2] the rule, ARGV[3] the identity,
// ARGV[4] the stream's bound, ARGV[5] the due member.
var resetScript = rueidis.NewLuaScript(`
local x = tonumber(redis.call('HGET', KEYS[3], 'x') or '0')
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if x == 0 then
  return 0
end
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
redis.call('ZREM', KEYS[6], ARGV[5])
local seq = redis.call('INCR', KEYS[5])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'rule', ARGV[2], 'key', ARGV[3],
  'kind', 'unblocked', 't', string.format('%d', math.min(now, x)), 'n', seq)
return 1
`)

// resetEvents is reset's deletion when events are on: resetScript.
func (s *Store) resetEvents(ctx context.Context, key string, k keyNames) error {
	mk := s.evMarker(k.tag)
	member := strconv.Itoa(len(mk)) + ":" + mk + key
	return resetScript.Exec(ctx, s.client, []string{k.state, k.block, mk, s.evStream(), s.evStream() + ":seq", s.evDue()},
		[]string{s.nowArg(), events.RuleOf(key), events.IdentityOf(key), strconv.Itoa(events.DefaultBound), member}).Error()
}
