package memstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/override"
)

// Overrides (internal/override): an exact key's override lives in a map of
// the key's shard, read and written under the shard's lock, so a decision
// sees an override from the moment SetOverride returns. Patterns live in
// an immutable list swapped whole. Until a first override is set the
// store holds none of this, and a decision pays one atomic load.

// overrides is the store's override state, made on the first SetOverride.
type overrides struct {
	exact    []map[string]*override.Override // per shard, under the shard's lock
	patterns atomic.Pointer[override.Patterns]

	mu    sync.Mutex // serialises changes: the count, the patterns, the log
	count int
	log   []override.Change // a ring of override.MaxLog
	next  int               // the ring's next index
	seq   int64
}

// ovr returns the store's override state, making it if need be.
func (s *Store) ovr() *overrides {
	if o := s.ovrs.Load(); o != nil {
		return o
	}
	s.limitsMu.Lock()
	defer s.limitsMu.Unlock()
	if o := s.ovrs.Load(); o != nil {
		return o
	}
	o := &overrides{exact: make([]map[string]*override.Override, len(s.shards))}
	o.patterns.Store(&override.Patterns{})
	s.ovrs.Store(o)
	return o
}

// overridden returns the limit key decides under: its live exact
// override's, else its longest live pattern's, else l; an override whose
// limit does not fit l (another algorithm) is ignored. The shard si must
// be locked.
func (s *Store) overridden(o *overrides, si int, key string, l *weir.Limit) *weir.Limit {
	var now time.Time
	if m := o.exact[si]; m != nil {
		if e := m[key]; e != nil {
			now = time.UnixMicro(s.micros())
			if e.Live(now) && override.Compatible(*l, e.Limit) {
				return &e.Limit
			}
		}
	}
	if ps := *o.patterns.Load(); len(ps) > 0 {
		if now.IsZero() {
			now = time.UnixMicro(s.micros())
		}
		if e := ps.Match(key, now); e != nil && override.Compatible(*l, e.Limit) {
			return &e.Limit
		}
	}
	return l
}

// SetOverride implements override.Store.
func (s *Store) SetOverride(ctx context.Context, ov override.Override) error {
	if err := override.Check(&ov, time.UnixMicro(s.micros())); err != nil {
		return err
	}
	o := s.ovr()
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, pat := ov.Pattern(); pat {
		ps := *o.patterns.Load()
		i := slices.IndexFunc(ps, func(e override.Override) bool { return e.Key == ov.Key })
		if i < 0 && o.count >= s.maxOverrides() {
			return s.boundError(o.count)
		}
		nps := slices.Clone(ps)
		if i >= 0 {
			nps[i] = ov
		} else {
			nps = append(nps, ov)
			o.count++
		}
		slices.SortStableFunc(nps, func(a, b override.Override) int { return len(b.Key) - len(a.Key) })
		np := override.Patterns(nps)
		o.patterns.Store(&np)
	} else {
		si, _ := s.hashIndex(ov.Key)
		sh := &s.shards[si]
		sh.mu.Lock()
		m := o.exact[si]
		_, had := m[ov.Key]
		if !had && o.count >= s.maxOverrides() {
			sh.mu.Unlock()
			return s.boundError(o.count)
		}
		if m == nil {
			m = map[string]*override.Override{}
			o.exact[si] = m
		}
		e := ov
		m[ov.Key] = &e
		sh.mu.Unlock()
		if !had {
			o.count++
		}
	}
	var until int64
	if !ov.Until.IsZero() {
		until = ov.Until.UnixMicro()
	}
	s.due.setOverride(ov.Key, until)
	o.audit("set", ov, time.UnixMicro(s.micros()))
	return nil
}

// maxOverrides is the most overrides the store keeps.
func (s *Store) maxOverrides() int {
	if s.ovrMax > 0 {
		return s.ovrMax
	}
	return override.MaxOverrides
}

// boundError refuses an override beyond the bound, checked before
// anything is written.
func (s *Store) boundError(n int) error {
	return &override.Error{Field: "key", Reason: fmt.Sprintf("the store holds %d overrides, the most it keeps (%d): delete one first", n, s.maxOverrides())}
}

// DeleteOverride implements override.Store.
func (s *Store) DeleteOverride(ctx context.Context, key string) (bool, error) {
	o := s.ovrs.Load()
	if o == nil {
		return false, nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var old override.Override
	found := false
	if _, pat := override.IsPattern(key); pat {
		ps := *o.patterns.Load()
		if i := slices.IndexFunc(ps, func(e override.Override) bool { return e.Key == key }); i >= 0 {
			old, found = ps[i], true
			np := override.Patterns(slices.Delete(slices.Clone(ps), i, i+1))
			o.patterns.Store(&np)
		}
	} else {
		si, _ := s.hashIndex(key)
		sh := &s.shards[si]
		sh.mu.Lock()
		if e := o.exact[si][key]; e != nil {
			old, found = *e, true
			delete(o.exact[si], key)
		}
		sh.mu.Unlock()
	}
	if found {
		s.due.setOverride(key, 0)
		o.count--
		o.audit("delete", old, time.UnixMicro(s.micros()))
	}
	return found, nil
}

// Overrides implements override.Store.
func (s *Store) Overrides(ctx context.Context, prefix string) ([]override.Override, error) {
	o := s.ovrs.Load()
	if o == nil {
		return nil, nil
	}
	var out []override.Override
	for si := range s.shards {
		sh := &s.shards[si]
		sh.mu.Lock()
		for k, e := range o.exact[si] {
			if strings.HasPrefix(k, prefix) {
				out = append(out, *e)
			}
		}
		sh.mu.Unlock()
	}
	for _, e := range *o.patterns.Load() {
		if strings.HasPrefix(e.Key, prefix) {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b override.Override) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// OverrideLog implements override.Store.
func (s *Store) OverrideLog(ctx context.Context, n int) ([]override.Change, error) {
	o := s.ovrs.Load()
	if o == nil || n <= 0 {
		return nil, nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []override.Change
	l := len(o.log)
	for i := range l {
		out = append(out, o.log[(o.next+i)%l])
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out, nil
}

// audit appends a change to the ring. o.mu must be held.
func (o *overrides) audit(op string, ov override.Override, now time.Time) {
	o.seq++
	c := override.Change{ID: strconv.FormatInt(now.UnixMilli(), 10) + "-" + strconv.FormatInt(o.seq, 10), Time: now, Op: op, Override: ov}
	if len(o.log) < override.MaxLog {
		o.log = append(o.log, c)
		return
	}
	o.log[o.next] = c
	o.next = (o.next + 1) % override.MaxLog
}

// baseMax is the largest cost the caller's limit l admits under mode,
// which a take is checked against before its key's override's (-1 for a
// debit or credit, which are checked against the override alone).
func (s *Store) baseMax(l weir.Limit, mode algorithm.Mode) (int64, error) {
	if mode >= algorithm.Debit {
		return -1, nil
	}
	c, err := s.compile(l)
	if err != nil {
		return -1, err
	}
	return c.params.MaxCost(), nil
}
