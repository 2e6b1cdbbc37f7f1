// Package localbudget spends a hot key's limit locally: an instance takes
// a local budget of up to N units at once from the shared store (one call, debited there before
// any is spent) and admits requests from them in memory, so a key that
// every instance hits costs the store one call per N decisions instead of
// one per decision. weir.yaml's `local_budget: N` on a rule turns it on; package
// policy calls Table.Take for such rules.
//
// The fleet never admits more than the limit: every unit spent was
// debited in the store first, and a unit is only spent inside the window
// (or sliding-window bucket) it was debited in, where spending it later
// counts exactly as spending it at once would have. That is why only
// fixed_window and sliding_window accept local budgets (algorithm.FieldLease):
// a bucket refills with time, so an event spent later than its unit was
// taken could add to a later burst.
//
// The price is under-admission: units an instance holds but does not spend
// are lost to the others until they lapse. Each instance holds at most one
// budget of at most N units per key, so at most instances × N units are
// held back at any time; they lapse, unspent, when the window or bucket
// they were taken in ends. docs/algorithms.md states the contract and
// what Result reports for a rule with a local budget.
package localbudget

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// DefaultMaxEntries bounds a Table by default: the keys it holds a budget
// or a remembered denial for at once.
const DefaultMaxEntries = 10_000

// Config configures a Table.
type Config struct {
	// MaxEntries bounds the keys (key and limit pairs) held at once
	// (DefaultMaxEntries if 0). When the table is full of live budgets,
	// a new key is decided by the store directly, without a budget.
	MaxEntries int
	// Now is the clock (time.Now if nil), for tests. Budget lifetimes are
	// measured on it from when each call to the store was sent.
	Now func() time.Time
}

// Table holds the budgets of one instance. It is safe for concurrent use;
// share one across policy reloads so that budgets and counters survive.
type Table struct {
	now        func() time.Time
	maxEntries int

	mu        sync.RWMutex
	entries   map[entryKey]*entry
	lastSweep time.Time

	calls, empty, taken, spent, lapsed, bypassed atomic.Int64
}

type entryKey struct {
	key   string
	limit weir.Limit
}

// entry is one key's budget. Its fields are guarded by mu.
type entry struct {
	mu      sync.Mutex
	units   int64     // unspent units
	expires time.Time // when the units lapse: the end of their window
	// deniedUntil: the store found nothing left; no request is sent for
	// this key until then (the store's RetryAfter from the call's send).
	deniedUntil time.Time
	limit       int64     // Result.Limit of the last call
	remote      int64     // the store's Remaining at the last call
	resetAt     time.Time // sent + the last call's ResetAfter
	wait        chan struct{}
	// dead: Forget dropped the entry (a reset). Units a refill in flight
	// brings back to it lapse, and its callers find the key's new entry.
	dead bool
}

// New returns an empty Table.
func New(cfg Config) *Table {
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Table{now: cfg.Now, maxEntries: cfg.MaxEntries, entries: map[entryKey]*entry{}}
}

// Supports reports whether algorithm a accepts a budget (the algorithm
// table's FieldLease).
func Supports(a weir.Algorithm) bool {
	k, ok := algorithm.ParseKind(string(a))
	if !ok {
		return false
	}
	s, _ := k.Spec()
	return s.Takes&algorithm.FieldLease != 0
}

// Size is the budget an instance takes for a rule with local_budget n under l when
// instances share it: n, but never more than l.Rate / instances (at least
// 1), so that the budgets of the whole fleet together never hold more than
// the limit.
func Size(n int64, l weir.Limit, instances int) int64 {
	if instances < 1 {
		instances = 1
	}
	return max(min(n, l.Rate/int64(instances)), 1)
}

// Take decides a request of cost n on key under l, spending from this
// instance's budget and taking a new budget of size units from st when the
// budget cannot cover n. n == 0 peeks at the store. A store error is
// returned as it is (the caller's on_error applies); nothing was spent.
func (t *Table) Take(ctx context.Context, st weir.Store, key string, l weir.Limit, n, size int64) (weir.Result, error) {
	r, _, err := t.TakeTicket(ctx, st, key, l, n, size)
	return r, err
}

// A Ticket stands for the units of one admission from a budget, so that a
// caller whose request is refused by another limit can Give them back.
// The zero Ticket (a decision the store made directly) gives nothing.
type Ticket struct {
	e       *entry
	n       int64
	expires time.Time
}

// TakeTicket is Take, with a Ticket for the units it admitted from the
// budget.
func (t *Table) TakeTicket(ctx context.Context, st weir.Store, key string, l weir.Limit, n, size int64) (weir.Result, Ticket, error) {
	if n <= 0 || n > l.Rate || size < 1 || !Supports(l.Algorithm) {
		r, err := st.Take(ctx, key, l, n) // peeks, invalid costs and limits: the store answers
		return r, Ticket{}, err
	}
	e := t.entry(key, l)
	if e == nil {
		t.bypassed.Add(1)
		r, err := st.Take(ctx, key, l, n)
		return r, Ticket{}, err
	}
	r, exp, e, err := t.take(ctx, st, e, key, l, n, size)
	if err != nil || !r.Allowed {
		return r, Ticket{}, err
	}
	return r, Ticket{e: e, n: n, expires: exp}, nil
}

// Give returns the units of tk to the budget they came from, unless their
// window has ended (they lapse) or the budget now holds units that last
// longer (they lapse too: a unit is only ever spent in its own window).
func (t *Table) Give(tk Ticket) {
	e := tk.e
	if e == nil || tk.n <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := t.now()
	t.lapse(e, now)
	t.spent.Add(-tk.n)
	switch {
	case e.dead || !now.Before(tk.expires):
		t.lapsed.Add(tk.n)
	case e.units == 0:
		e.units, e.expires = tk.n, tk.expires
	case !e.expires.After(tk.expires):
		e.units += tk.n // the budget's units end no later than these
	default:
		t.lapsed.Add(tk.n)
	}
}

// take is TakeTicket on e; it also returns when the units it admitted
// lapse, and the entry they came from (the key's new one if a reset
// dropped e meanwhile).
func (t *Table) take(ctx context.Context, st weir.Store, e *entry, key string, l weir.Limit, n, size int64) (weir.Result, time.Time, *entry, error) {
	for tries := 0; ; tries++ {
		e.mu.Lock()
		if e.dead {
			// A reset dropped e: its units, and any a refill brings back
			// to it, were taken before the reset and must not be spent.
			e.mu.Unlock()
			if e = t.entry(key, l); e == nil {
				t.bypassed.Add(1)
				r, err := st.Take(ctx, key, l, n)
				return r, time.Time{}, nil, err
			}
			continue
		}
		now := t.now()
		t.lapse(e, now)
		if e.units >= n {
			e.units -= n
			t.spent.Add(n)
			r, exp := e.result(now, n), e.expires
			e.mu.Unlock()
			return r, exp, e, nil
		}
		if now.Before(e.deniedUntil) {
			r := e.denied(now)
			e.mu.Unlock()
			return r, time.Time{}, e, nil
		}
		if ch := e.wait; ch != nil {
			// Another caller is taking a budget for this key: wait for it.
			e.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return weir.Result{}, time.Time{}, e, ctx.Err()
			}
		}
		ch := make(chan struct{})
		e.wait = ch
		have := e.units
		e.mu.Unlock()
		r, exp, late, err := t.refill(ctx, st, e, key, l, n, max(size, n)-have)
		e.mu.Lock()
		e.wait = nil
		close(ch)
		dead := e.dead
		e.mu.Unlock()
		if dead && err == nil {
			continue // reset while the call was out: ask the key's new entry
		}
		if late && tries < 2 {
			continue // the window ended while the call was out: ask in the new one
		}
		return r, exp, e, err
	}
}

// refill takes up to c units from the store for e, then admits n from
// them if it can. e.wait is set, so no other caller refills meanwhile;
// callers may still spend units e held before, and lapse them.
//
// late reports that the units came but their window ended while the call
// was out, so they lapsed at once: the caller should ask again.
func (t *Table) refill(ctx context.Context, st weir.Store, e *entry, key string, l weir.Limit, n, c int64) (r weir.Result, exp time.Time, late bool, err error) {
	sent := t.now()
	var out [1]weir.Result
	err = st.Do(ctx, []weir.Request{{Key: key, Limit: l, N: c, Mode: weir.ModeAtMost}}, out[:])
	t.calls.Add(1)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		return weir.Result{}, time.Time{}, false, err
	}
	r = out[0]
	now := t.now()
	if e.dead {
		// A reset dropped e while the call was out: what it debited
		// counted before the reset and lapses; the caller asks again.
		t.taken.Add(max(r.Granted, 0))
		t.lapsed.Add(max(r.Granted, 0))
		return weir.Result{}, time.Time{}, true, nil
	}
	t.lapse(e, now)
	e.limit, e.remote, e.resetAt = r.Limit, max(r.Remaining, 0), sent.Add(r.ResetAfter)
	if r.Granted <= 0 {
		t.empty.Add(1)
		e.deniedUntil = sent.Add(r.RetryAfter)
		return e.denied(now), time.Time{}, false, nil
	}
	t.taken.Add(r.Granted)
	exp = sent.Add(lifetime(l, r))
	if e.units > 0 && e.expires.Before(exp) {
		exp = e.expires // older units keep their own, earlier end
	}
	e.units += r.Granted
	e.expires = exp
	if !now.Before(exp) {
		t.lapse(e, now) // the window ended while the call was out
		late = true
	}
	if e.units < n {
		// Part of a larger request: keep the units for smaller ones, and
		// reject this one as the store would have.
		res := e.denied(now)
		res.RetryAfter = max(exp.Sub(now), 0)
		return res, time.Time{}, late, nil
	}
	e.units -= n
	t.spent.Add(n)
	return e.result(now, n), e.expires, false, nil
}

// lifetime is how long after the store decided the units stay in their
// window: to the end of the fixed window, or of the sliding window's
// current window or bucket (a sliding window's ResetAfter, with the
// current window holding a count, is the end of that window or bucket
// plus one period).
func lifetime(l weir.Limit, r weir.Result) time.Duration {
	switch l.Algorithm {
	case weir.FixedWindow:
		return max(r.ResetAfter, 0)
	case weir.SlidingWindow:
		return max(r.ResetAfter-l.Period, 0)
	}
	return 0
}

// lapse drops e's units if their window ended. e.mu is held.
func (t *Table) lapse(e *entry, now time.Time) {
	if e.units > 0 && !now.Before(e.expires) {
		t.lapsed.Add(e.units)
		e.units = 0
	}
}

// result is an admission of n from the budget. e.mu is held.
func (e *entry) result(now time.Time, n int64) weir.Result {
	return weir.Result{Allowed: true, Granted: n, Limit: e.limit, Remaining: e.remote + e.units, ResetAfter: max(e.resetAt.Sub(now), 0)}
}

// denied is a rejection while the store has nothing left. e.mu is held.
func (e *entry) denied(now time.Time) weir.Result {
	return weir.Result{Limit: e.limit, Remaining: e.units, RetryAfter: max(e.deniedUntil.Sub(now), 0), ResetAfter: max(e.resetAt.Sub(now), 0)}
}

// entry returns key's entry under l, creating it; nil when the table is
// full of live entries.
func (t *Table) entry(key string, l weir.Limit) *entry {
	k := entryKey{key, l}
	t.mu.RLock()
	e := t.entries[k]
	t.mu.RUnlock()
	if e != nil {
		return e
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e = t.entries[k]; e != nil {
		return e
	}
	if len(t.entries) >= t.maxEntries {
		now := t.now()
		if now.Sub(t.lastSweep) >= time.Second || now.Before(t.lastSweep) {
			t.lastSweep = now
			t.sweep(now)
		}
		if len(t.entries) >= t.maxEntries {
			return nil
		}
	}
	e = &entry{}
	t.entries[k] = e
	return e
}

// sweep drops the entries that hold nothing: no units in force, no denial
// in force, no call out. t.mu is held.
func (t *Table) sweep(now time.Time) {
	for k, e := range t.entries {
		e.mu.Lock()
		t.lapse(e, now)
		dead := e.units == 0 && e.wait == nil && !now.Before(e.deniedUntil)
		e.mu.Unlock()
		if dead {
			delete(t.entries, k)
		}
	}
}

// Forget drops this instance's budget and remembered denial for key under
// l, after a reset: its unspent units lapse at once.
func (t *Table) Forget(key string, l weir.Limit) {
	t.mu.Lock()
	e := t.entries[entryKey{key, l}]
	delete(t.entries, entryKey{key, l})
	t.mu.Unlock()
	if e != nil {
		e.mu.Lock()
		t.lapsed.Add(e.units)
		e.units, e.deniedUntil = 0, time.Time{}
		e.dead = true
		e.mu.Unlock()
	}
}

// Stats are a Table's counters since it was made.
type Stats struct {
	Calls    int64 // calls to the store that asked for a budget
	Empty    int64 // of them, those that found nothing left
	Taken    int64 // units debited in the store by those calls
	Spent    int64 // units admitted from budgets
	Lapsed   int64 // units that lapsed unspent (window ended, or a reset)
	Bypassed int64 // decisions sent to the store without a budget (table full)
	Entries  int   // keys held now
}

// Stats returns the table's counters.
func (t *Table) Stats() Stats {
	t.mu.RLock()
	n := len(t.entries)
	t.mu.RUnlock()
	return Stats{
		Calls: t.calls.Load(), Empty: t.empty.Load(), Taken: t.taken.Load(), Spent: t.spent.Load(),
		Lapsed: t.lapsed.Load(), Bypassed: t.bypassed.Load(), Entries: n,
	}
}
