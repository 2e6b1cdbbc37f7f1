package memstore

import (
	"context"
	"sync/atomic"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/events"
)

// Events (internal/events): a decision on a key whose rule has events
// makes the crossing check (events.Check) under its shard's lock, against
// the key's marker in the shard's ev map, so each crossing fires once per
// key, threshold and window however many goroutines decide at once. What
// fires goes to a ring of events.DefaultBound.
// Until SetEventRules is called a decision pays one atomic load.

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

// Events implements events.Store.
func (e eventsOf) Events(ctx context.Context, since string, n int) ([]events.Event, error) {
	return e.s.events(ctx, since, n)
}

// evState is the store's event settings, replaced whole.
type evState struct {
	rules map[string]evRule
	ring  *events.Ring
	lost  atomic.Int64 // events not recorded: a shard's markers were full
}

type evRule struct {
	rule events.Rule
	pm   []int64
}

// setEventRules implements events.Store.
func (s *Store) setEventRules(rules map[string]events.Rule) error {
	if err := events.CheckRules(rules); err != nil {
		return err
	}
	s.evMu.Lock()
	defer s.evMu.Unlock()
	old := s.evts.Load()
	if len(rules) == 0 && old == nil {
		return nil
	}
	st := &evState{rules: make(map[string]evRule, len(rules))}
	for name, r := range rules {
		r.Thresholds = append([]float64(nil), r.Thresholds...)
		st.rules[name] = evRule{rule: r, pm: r.Permille()}
	}
	if old != nil {
		st.ring = old.ring
		st.lost.Store(old.lost.Load())
	} else {
		st.ring = events.NewRing(events.DefaultBound)
	}
	s.evts.Store(st)
	return nil
}

// events implements events.Store.
func (s *Store) events(ctx context.Context, since string, n int) ([]events.Event, error) {
	st := s.evts.Load()
	if st == nil {
		_, err := events.SeqOf(since)
		return nil, err
	}
	return st.ring.Since(since, n)
}

// fire makes the crossing check of a decision d of cost n on key under
// c at now.
// The key's shard sh must be locked.
func (s *Store) fire(st *evState, sh *shard, key string, n int64, c *compiled, d *algorithm.Outcome, now int64) {
	rule := events.RuleOf(key)
	r, ok := st.rules[rule]
	if !ok {
		return
	}
	m, had := sh.ev[key]
	var buf [events.MaxThresholds + 1]events.Fired
	out := events.Check(r.pm, &m, now, windowEnd(c, d, now), d.Limit, d.Remaining, d.Granted, !d.Allowed && n > 0, buf[:0])
	if len(out) == 0 {
		if had && m.End == 0 {
			delete(sh.ev, key) // its window is over
		}
		return
	}
	if !had {
		if sh.ev == nil {
			sh.ev = map[string]events.Marker{}
		}
		if len(sh.ev) >= max(sh.limit, minShardKeys) {
			for k, v := range sh.ev {
				if v.End <= now {
					delete(sh.ev, k)
				}
			}
			if len(sh.ev) >= max(sh.limit, minShardKeys) {
				st.lost.Add(int64(len(out)))
				return
			}
		}
	}
	sh.ev[key] = m
	for _, f := range out {
		st.ring.Add(events.Make(rule, &r.rule, key, f, now))
	}
}

// windowEnd is when an event window that starts now ends: a fixed
// window's own end, else one period on.
func windowEnd(c *compiled, d *algorithm.Outcome, now int64) int64 {
	l := &c.limit
	p := l.Period.Microseconds()
	switch {
	case l.Algorithm == weir.FixedWindow && l.Calendar == 0 && p > 0:
		return (now/p + 1) * p
	case l.Algorithm == weir.FixedWindow && d.ResetAfter > 0:
		return now + d.ResetAfter
	case p > 0:
		return now + p
	}
	return now + c.params.Period
}
