package server

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Fleet reporting: with Redis, every instance publishes its last few
// seconds of counters (and its hot keys) every second under
// <prefix>:fleet:<instance-id> with a short TTL, notes the time in the ZSET
// <prefix>:fleet, and reads everyone else's, so that any instance's dashboard
// shows the whole fleet. An instance that stops publishing drops out of
// the instance list when its key expires; the seconds it reported stay in
// the series.
const (
	fleetPublishSeconds = 5                // seconds of counters in each report
	fleetTTL            = 10 * time.Second // a report's lifetime in Redis
	fleetAlive          = 15 * time.Second // a report this recent means the instance is up
	fleetTopN           = 10               // hot keys per rule in a report
	fleetMaxInstances   = 1000             // reports read at most
)

// fleetReport is what an instance publishes.
type fleetReport struct {
	ID      string `json:"id"`
	Version string `json:"version"`
	NowMS   int64  `json:"now_ms"`
	// Start is the Unix second of the first counts of every rule.
	Start int64 `json:"start"`
	// Rules holds, per rule, one [allowed, limited, shadow_limited,
	// errors] per second from Start.
	Rules map[string][]counts   `json:"rules"`
	Top   map[string][]TopEntry `json:"top,omitempty"`
}

// remote is what this instance knows of another.
type remote struct {
	id, version string
	lastSeenMS  int64
	present     bool // its report was in Redis at the last collection
	rules       map[string]*series
	top         map[string][]TopEntry
}

type fleet struct {
	s       *Server
	mu      sync.Mutex
	remotes map[string]*remote
	// live is how many instances had a report in Redis at the last
	// collection, this one included; 0 before the first (instances: auto
	// then uses its floor).
	live atomic.Int64
}

// count returns the fleet's size as the last collection found it, for
// instances: auto: every instance whose report (TTL fleetTTL) was in
// Redis, this one included. 0 until a collection has succeeded; when one
// fails the last count stays.
func (f *fleet) count() int { return int(f.live.Load()) }

func newFleet(s *Server) *fleet { return &fleet{s: s, remotes: make(map[string]*remote)} }

func (f *fleet) key() string { return f.s.keys.fleetPrefix + f.s.id }

// run publishes and collects every second until ctx ends.
func (f *fleet) run(ctx context.Context) {
	f.s.redisLoop(ctx, f.s.o.fleetEvery, true, f.tick,
		"weir: exchanging fleet counters through Redis failed; the dashboard shows this instance only",
		"weir: exchanging fleet counters through Redis works again")
}

func (f *fleet) tick(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := f.publish(ctx); err != nil {
		return err
	}
	return f.collect(ctx)
}

// report builds this instance's report.
func (f *fleet) report(now time.Time) fleetReport {
	st := f.s.stats
	start := now.Unix() - fleetPublishSeconds + 1
	r := fleetReport{ID: f.s.id, Version: f.s.version, NowMS: now.UnixMilli(), Start: start, Rules: map[string][]counts{}}
	for _, name := range st.names() {
		w := st.window(name, start, fleetPublishSeconds)
		for _, c := range w {
			if c.decisions() > 0 {
				r.Rules[name] = w
				break
			}
		}
	}
	r.Top = f.s.tops.all(fleetTopN)
	return r
}

func (f *fleet) publish(ctx context.Context) error {
	body, err := json.Marshal(f.report(f.s.now()))
	if err != nil {
		return err
	}
	rdb := f.s.rdb
	now := f.s.now().UnixMilli()
	for _, res := range rdb.DoMulti(ctx,
		rdb.B().Set().Key(f.key()).Value(string(body)).Px(fleetTTL).Build(),
		rdb.B().Zadd().Key(f.s.keys.fleetIndex).ScoreMember().ScoreMember(float64(now), f.s.id).Build(),
		rdb.B().Zremrangebyscore().Key(f.s.keys.fleetIndex).Min("-inf").Max(strconv.FormatInt(now-seriesLen*1000, 10)).Build(),
	) {
		if err := res.Error(); err != nil {
			return err
		}
	}
	return nil
}

// collect reads every other instance's report. The instances are found
// in the ZSET weir:fleet (id → last report, ms) rather than by SCAN, whose
// cost grows with the whole keyspace: with a hundred thousand limiter keys
// a SCAN every second would cost Redis more than the limiting.
func (f *fleet) collect(ctx context.Context) error {
	rdb := f.s.rdb
	since := f.s.now().Add(-fleetAlive).UnixMilli()
	ids, err := rdb.Do(ctx, rdb.B().Zrange().Key(f.s.keys.fleetIndex).Min(strconv.FormatInt(since, 10)).Max("+inf").
		Byscore().Limit(0, fleetMaxInstances).Build()).AsStrSlice()
	if err != nil && !rueidis.IsRedisNil(err) {
		return err
	}
	found := map[string]bool{}
	var cmds rueidis.Commands
	for _, id := range ids {
		if id != f.s.id {
			cmds = append(cmds, rdb.B().Get().Key(f.s.keys.fleetPrefix+id).Build())
		}
	}
	if len(cmds) > 0 {
		for _, res := range rdb.DoMulti(ctx, cmds...) {
			data, err := res.AsBytes()
			if err != nil {
				continue // expired: the instance stopped reporting
			}
			var rep fleetReport
			if json.Unmarshal(data, &rep) != nil || rep.ID == "" || rep.ID == f.s.id {
				continue
			}
			f.merge(rep)
			found[rep.ID] = true
		}
	}
	f.mu.Lock()
	for id, r := range f.remotes {
		r.present = found[id] // a withdrawn or expired report: the instance is gone
	}
	f.mu.Unlock()
	f.live.Store(int64(1 + len(found)))
	f.expire(f.s.now())
	return nil
}

// merge takes in a report: each second it holds overwrites what an older
// report said about that second.
func (f *fleet) merge(rep fleetReport) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.remotes[rep.ID]
	if r == nil {
		if len(f.remotes) >= fleetMaxInstances {
			return
		}
		r = &remote{id: rep.ID, rules: map[string]*series{}}
		f.remotes[rep.ID] = r
	}
	if rep.NowMS < r.lastSeenMS {
		return // an older report than one already seen
	}
	r.version, r.lastSeenMS, r.top = rep.Version, rep.NowMS, rep.Top
	for rule, cs := range rep.Rules {
		if len(cs) > seriesLen {
			cs = cs[:seriesLen]
		}
		se := r.rules[rule]
		if se == nil {
			se = &series{}
			r.rules[rule] = se
		}
		for i, c := range cs {
			se.set(rep.Start+int64(i), c)
		}
	}
}

// expire forgets instances whose last report is older than the series.
func (f *fleet) expire(now time.Time) {
	cutoff := now.UnixMilli() - seriesLen*1000
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, r := range f.remotes {
		if r.lastSeenMS < cutoff {
			delete(f.remotes, id)
		}
	}
}

// withdraw deletes this instance's report, so that it leaves the fleet
// view at once when it shuts down.
func (f *fleet) withdraw() {
	rdb := f.s.rdb
	if rdb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rdb.DoMulti(ctx, rdb.B().Del().Key(f.key()).Build(), rdb.B().Zrem().Key(f.s.keys.fleetIndex).Member(f.s.id).Build())
}

// remoteTops returns the hot keys of the instances alive now.
func (f *fleet) remoteTops() []map[string][]TopEntry {
	alive := f.s.now().UnixMilli() - fleetAlive.Milliseconds()
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []map[string][]TopEntry
	for _, r := range f.remotes {
		if r.present && r.lastSeenMS >= alive && len(r.top) > 0 {
			out = append(out, r.top)
		}
	}
	return out
}

// FleetInstance is one instance in the snapshot's per-instance breakdown,
// with its decisions per second over the last five complete seconds.
type FleetInstance struct {
	ID                string  `json:"id"`
	Version           string  `json:"version,omitempty"`
	LastSeenMS        int64   `json:"last_seen_ms"`
	AllowedPerS       float64 `json:"allowed_per_s"`
	LimitedPerS       float64 `json:"limited_per_s"`
	ShadowLimitedPerS float64 `json:"shadow_limited_per_s"`
	Self              bool    `json:"self,omitempty"`
}

// rateSeconds is how many complete seconds the per-instance rates average.
const rateSeconds = 5

// fleetWindow adds up, per rule, the counters of this instance and every
// remote one for the seconds from .. from+n-1, and lists the instances
// alive with their recent rates.
func (f *fleet) fleetWindow(now time.Time, from int64, n int) (map[string][]counts, []FleetInstance) {
	st := f.s.stats
	rules := map[string][]counts{}
	self := FleetInstance{ID: f.s.id, Version: f.s.version, LastSeenMS: now.UnixMilli(), Self: true}
	var selfRate counts
	for _, name := range st.names() {
		w := st.window(name, from, n)
		rules[name] = w
		for _, c := range w[max(n-rateSeconds, 0):] {
			selfRate.add(c)
		}
	}
	self.AllowedPerS, self.LimitedPerS, self.ShadowLimitedPerS = rates(selfRate)
	instances := []FleetInstance{self}

	alive := now.UnixMilli() - fleetAlive.Milliseconds()
	f.mu.Lock()
	ids := sortedKeys(f.remotes)
	for _, id := range ids {
		r := f.remotes[id]
		var rate counts
		for name, se := range r.rules {
			w := rules[name]
			if w == nil {
				w = make([]counts, n)
				rules[name] = w
			}
			for i := range w {
				c := se.get(from + int64(i))
				w[i].add(c)
				if i >= n-rateSeconds {
					rate.add(c)
				}
			}
		}
		if r.present && r.lastSeenMS >= alive {
			iv := FleetInstance{ID: r.id, Version: r.version, LastSeenMS: r.lastSeenMS}
			iv.AllowedPerS, iv.LimitedPerS, iv.ShadowLimitedPerS = rates(rate)
			instances = append(instances, iv)
		}
	}
	f.mu.Unlock()
	return rules, instances
}

func rates(c counts) (allowed, limited, shadow float64) {
	per := func(v int64) float64 { return float64(int64(float64(v)/rateSeconds*100+0.5)) / 100 }
	return per(c[outAllowed]), per(c[outLimited]), per(c[outShadowLimited])
}
