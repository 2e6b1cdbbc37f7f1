package memstore

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"

	"time"

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

// Sweep implements events.Store.
func (e eventsOf) Sweep(ctx context.Context) (int, error) { return e.s.sweep(), nil }

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
// c at now, and the penalty-box check (events.BoxCheck).
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
	var left int64
	var entered, moved bool
	if c.params.Block > 0 || m.Box != 0 {
		left, entered, moved = events.BoxCheck(&m, now, d.BlockedUntil)
	}
	if len(out) == 0 && left == 0 && !entered && !moved {
		if had && m.End == 0 && m.Box == 0 {
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
				if v.End <= now && (v.Box == 0 || v.Box+events.Grace.Microseconds() <= now) {
					delete(sh.ev, k)
				}
			}
			if len(sh.ev) >= max(sh.limit, minShardKeys) {
				st.lost.Add(int64(len(out)))
				return
			}
		}
	}
	if entered && !s.due.push(dueItem{at: m.Box, key: key}) {
		m.Box, entered = 0, false // beyond the bound: this box has no events
		st.lost.Add(1)
	}
	sh.ev[key] = m
	if left != 0 {
		st.ring.Add(events.Box(rule, key, left, true))
	}
	for _, f := range out {
		st.ring.Add(events.Make(rule, &r.rule, key, f, now))
	}
	if entered {
		st.ring.Add(events.Box(rule, key, now, false))
	}
}

// dueItem is a penalty box's end (key a store key) or an override's
// expiry (ovr set) that the sweeper announces at at (µs).
type dueItem struct {
	at  int64
	key string
	ovr bool
}

// dueHeap holds what falls due, earliest first, up to events.MaxDue.
// A box's item is checked against its key's marker when it falls due (a
// box extended since is due again at its new end; one already announced
// by a decision is dropped), an override's against ovrDue.
type dueHeap struct {
	mu    sync.Mutex
	items dueItems
	// ovrDue maps each override key with an until to it: the expiry
	// the sweeper still owes (override.go keeps it).
	ovrDue map[string]int64
}

type dueItems []dueItem

func (h dueItems) Len() int           { return len(h) }
func (h dueItems) Less(i, j int) bool { return h[i].at < h[j].at }
func (h dueItems) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueItems) Push(x any)        { *h = append(*h, x.(dueItem)) }
func (h *dueItems) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// push adds it unless the heap is full.
func (h *dueHeap) push(it dueItem) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.items) >= events.MaxDue {
		return false
	}
	heap.Push(&h.items, it)
	return true
}

// setOverride records that the override key expires at until (0: never),
// replacing what it owed before. An item is pushed only for a new until;
// a stale one is dropped when it falls due. When stale items outnumber
// the live ones the heap is rebuilt, so its size stays within twice the
// overrides' bound plus the boxes'.
func (h *dueHeap) setOverride(key string, until int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if until == 0 {
		delete(h.ovrDue, key)
		return
	}
	if h.ovrDue == nil {
		h.ovrDue = map[string]int64{}
	}
	if h.ovrDue[key] == until {
		return
	}
	h.ovrDue[key] = until
	if len(h.items) >= events.MaxDue {
		h.compact()
	}
	heap.Push(&h.items, dueItem{at: until, key: key, ovr: true})
}

// compact drops the override items no longer owed. h.mu must be held.
func (h *dueHeap) compact() {
	kept := h.items[:0]
	for _, it := range h.items {
		if !it.ovr || h.ovrDue[it.key] == it.at {
			kept = append(kept, it)
		}
	}
	clear(h.items[len(kept):])
	h.items = kept
	heap.Init(&h.items)
}

// popDue removes and returns the items due by now, up to max.
func (h *dueHeap) popDue(now int64, max int) []dueItem {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []dueItem
	for len(h.items) > 0 && h.items[0].at <= now && len(out) < max {
		it := heap.Pop(&h.items).(dueItem)
		if it.ovr {
			if h.ovrDue[it.key] != it.at {
				continue // replaced or deleted since
			}
			delete(h.ovrDue, it.key)
		}
		out = append(out, it)
	}
	return out
}

// sweepBatch is the most items one sweep takes.
const sweepBatch = 4096

// sweep records the unblocked events of the boxes that ended and the
// override_expired events of the overrides that expired, each once.
func (s *Store) sweep() int {
	now := s.micros()
	items := s.due.popDue(now, sweepBatch)
	st := s.evts.Load()
	fired := 0
	for _, it := range items {
		rule := events.RuleOf(it.key)
		if it.ovr {
			if st != nil {
				if _, ok := st.rules[rule]; ok {
					st.ring.Add(events.Event{Time: time.UnixMicro(it.at).UTC(), Rule: rule, Key: events.IdentityOf(it.key), Kind: events.KindOverrideExpired})
					fired++
				}
			}
			continue
		}
		sh, _ := s.hash(it.key)
		sh.mu.Lock()
		m, ok := sh.ev[it.key]
		switch {
		case !ok || m.Box == 0 || m.Box < it.at:
			// Announced by a decision, or reset.
		case m.Box > it.at:
			// Extended: due at its new end.
			if !s.due.push(dueItem{at: m.Box, key: it.key}) {
				m.Box = 0 // beyond the bound: its end is not announced
				sh.ev[it.key] = m
			}
		default:
			m.Box = 0
			if m.End <= now {
				delete(sh.ev, it.key)
			} else {
				sh.ev[it.key] = m
			}
			if st != nil {
				st.ring.Add(events.Box(rule, it.key, it.at, true))
				fired++
			}
		}
		sh.mu.Unlock()
	}
	return fired
}

// resetEvents clears key's marker as a reset clears its state: its
// thresholds fire again, and a box announced and in force is announced
// left at now. The key's shard sh must be locked.
func (s *Store) resetEvents(sh *shard, key string, now int64) {
	m, ok := sh.ev[key]
	if !ok {
		return
	}
	delete(sh.ev, key)
	if st := s.evts.Load(); st != nil && m.Box != 0 {
		st.ring.Add(events.Box(events.RuleOf(key), key, min(now, m.Box), true))
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
