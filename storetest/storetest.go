// Package storetest is the conformance suite that every weir.Store must
// pass, in the manner of testing/fstest: a store's own test calls Run with
// a function that builds a fresh store under test.
//
// The suite checks every algorithm for the exact admitted sequence at given
// clock steps, weighted costs, peeks, rejections that consume nothing,
// RetryAfter and ResetAfter to the microsecond, partial grants, the penalty
// box, Reset, bad input, key isolation, expiry, all-or-nothing batches,
// leases, and a hammer test in which many goroutines race on a few keys and
// the admitted count must equal the limit exactly.
//
// The suite is itself tested, as testing/fstest is: its own tests run it
// against memstores broken in one way each (admitting one too many,
// charging rejections, a late or early RetryAfter, a late ResetAfter, a
// millisecond clock, a penalty box ignored, lost or kept past Reset, peeks
// that consume or start the box, a batch that is not all-or-nothing, AtMost
// ignored, Release ignored, bad costs not refused, colliding keys, expiries
// too long, no shaping) and require each to fail in the subtest that names
// its defect, while the correct memstore passes.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
)

// Clock is a manually stepped clock. A store under test reads it through
// Now; the suite moves it with Advance.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock stopped at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// Epoch is where the suite starts its clock: a whole day, so that windows
// aligned to the Unix epoch start exactly there.
var Epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// Harness is a store under test.
type Harness struct {
	Store weir.Store
	// Clock is the store's clock, which the suite steps. Stores that always
	// read real time leave it nil; the tests that need exact time are then
	// skipped.
	Clock *Clock
	// TTL reports how long the store will keep key's state under l, and
	// whether it keeps any. Optional; the expiry tests need it.
	TTL func(key string, l weir.Limit) (time.Duration, bool)
	// TTLSlack is how much longer than the state's useful life a store may
	// keep it (Redis rounds expiries up to whole milliseconds).
	TTLSlack time.Duration
}

// Run runs the conformance suite. newHarness is called once per subtest
// and must return an independent store (or one whose keys cannot collide
// with other subtests'; the suite prefixes every key with the test name).
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	type variant struct {
		name    string
		algo    weir.Algorithm
		buckets int64
	}
	var variants []variant
	for _, a := range weir.Algorithms() {
		variants = append(variants, variant{string(a), a, 0})
	}
	// The bucketed sliding window runs the whole suite too: 4 buckets, so
	// that the base limit's buckets are one emission interval each.
	variants = append(variants, variant{"sliding_window_buckets", weir.SlidingWindow, sequenceBuckets})
	for _, v := range variants {
		a := v.algo
		t.Run(v.name, func(t *testing.T) {
			for _, tc := range append([]struct {
				name  string
				clock bool
				fn    func(*tester)
			}{
				{"Sequence", true, (*tester).sequence},
				{"Peek", false, (*tester).peek},
				{"Weighted", false, (*tester).weighted},
				{"RejectionConsumesNothing", true, (*tester).rejectionConsumesNothing},
				{"RetryAfterExact", true, (*tester).retryAfterExact},
				{"ResetAfterExact", true, (*tester).resetAfterExact},
				{"AtMost", false, (*tester).atMost},
				{"PenaltyBox", true, (*tester).penaltyBox},
				{"EscalatingPenalty", true, (*tester).escalatingPenalty},
				{"Reset", false, (*tester).reset},
				{"BadInput", false, (*tester).badInput},
				{"KeyIsolation", false, (*tester).keyIsolation},
				{"Expiry", true, (*tester).expiry},
				{"Hammer", false, (*tester).hammer},
				{"Batch", false, (*tester).batch},
				{"SameAsTokenBucket", true, (*tester).sameAsTokenBucket},
				{"LoweredBurst", true, (*tester).loweredBurst},
			}, debtTests...) {
				t.Run(tc.name, func(t *testing.T) {
					h := newHarness(t)
					if tc.clock && h.Clock == nil {
						t.Skip("needs a controllable clock")
					}
					if h.Clock != nil {
						h.Clock.Set(Epoch)
					}
					tc.fn(&tester{T: t, h: h, algo: a, buckets: v.buckets, lim: weir.NewLimiter(h.Store), prefix: t.Name() + "/"})
				})
			}
		})
	}
	t.Run("concurrency/Leases", func(t *testing.T) {
		h := newHarness(t)
		if h.Clock != nil {
			h.Clock.Set(Epoch)
		}
		(&tester{T: t, h: h, algo: weir.Concurrency, lim: weir.NewLimiter(h.Store), prefix: t.Name() + "/"}).leases()
	})
	for _, a := range []weir.Algorithm{weir.TokenBucket, weir.GCRA} {
		t.Run(string(a)+"/Warmup", func(t *testing.T) {
			h := newHarness(t)
			if h.Clock == nil {
				t.Skip("needs a controllable clock")
			}
			h.Clock.Set(Epoch)
			(&tester{T: t, h: h, algo: a, lim: weir.NewLimiter(h.Store), prefix: t.Name() + "/"}).warmup()
		})
	}
	t.Run("fixed_window/Calendar", func(t *testing.T) {
		h := newHarness(t)
		if h.Clock == nil {
			t.Skip("needs a controllable clock")
		}
		(&tester{T: t, h: h, algo: weir.FixedWindow, lim: weir.NewLimiter(h.Store), prefix: t.Name() + "/"}).calendar()
	})
	t.Run("leaky_bucket/Shaping", func(t *testing.T) {
		h := newHarness(t)
		if h.Clock == nil {
			t.Skip("needs a controllable clock")
		}
		h.Clock.Set(Epoch)
		(&tester{T: t, h: h, algo: weir.LeakyBucket, lim: weir.NewLimiter(h.Store), prefix: t.Name() + "/"}).shaping()
	})
}

type tester struct {
	*testing.T
	h    Harness
	algo weir.Algorithm
	// buckets is the sliding window's Buckets in every limit the suite
	// makes (0 for the plain window and the other algorithms).
	buckets int64
	lim     *weir.Limiter
	prefix  string
}

// sequenceBuckets is the bucket count of the suite's bucketed sliding window.
const sequenceBuckets = 4

// unit is the base limit's emission interval: 4 events per minute.
const unit = 15 * time.Second

// base returns the suite's standard limit: 4 per minute (4 slots with a
// one-minute lease for concurrency). A minute is long enough that a real
// Redis never expires state while a test is still stepping its clock.
func (t *tester) base() weir.Limit {
	return t.limit(4, time.Minute)
}

// limit returns a limit of rate per period under the tester's algorithm.
func (t *tester) limit(rate int64, period time.Duration) weir.Limit {
	return weir.Limit{Algorithm: t.algo, Rate: rate, Period: period, Buckets: t.buckets}
}

func (t *tester) key(name string) string { return t.prefix + name }

func (t *tester) advance(d time.Duration) {
	t.Helper()
	if t.h.Clock == nil {
		t.Fatalf("advance(%v) without a clock", d)
	}
	t.h.Clock.Advance(d)
}

func (t *tester) at(d time.Duration) {
	t.h.Clock.Set(Epoch.Add(d))
}

func (t *tester) take(key string, l weir.Limit, n int64) weir.Result {
	t.Helper()
	res, err := t.h.Store.Take(context.Background(), t.key(key), l, n)
	if err != nil {
		t.Fatalf("Take(%q, %v, %d): %v", key, l, n, err)
	}
	return res
}

type want struct {
	allowed   bool
	remaining int64
	retry     time.Duration // checked when not allowed
}

func (t *tester) expect(what string, got weir.Result, w want) {
	t.Helper()
	if got.Allowed != w.allowed || got.Remaining != w.remaining || (!w.allowed && got.RetryAfter != w.retry) {
		t.Fatalf("%s: got allowed=%v remaining=%d retry=%v; want allowed=%v remaining=%d retry=%v",
			what, got.Allowed, got.Remaining, got.RetryAfter, w.allowed, w.remaining, w.retry)
	}
	if got.Allowed && got.RetryAfter != 0 {
		t.Fatalf("%s: allowed with RetryAfter %v", what, got.RetryAfter)
	}
}

type step struct {
	at   time.Duration
	n    int64
	want want
}

// sequence checks an exact, hand-computed admission sequence for each
// algorithm under the base limit.
func (t *tester) sequence() {
	u := unit
	var steps []step
	switch t.algo {
	case weir.FixedWindow:
		steps = []step{
			{0, 1, want{true, 3, 0}}, {0, 1, want{true, 2, 0}}, {0, 2, want{true, 0, 0}},
			{0, 1, want{false, 0, 4 * u}},
			{2*u + 3*time.Second, 1, want{false, 0, 2*u - 3*time.Second}},
			{4 * u, 3, want{true, 1, 0}}, {4 * u, 2, want{false, 1, 4 * u}}, {4 * u, 1, want{true, 0, 0}},
			{8*u - time.Microsecond, 1, want{false, 0, time.Microsecond}},
			{8 * u, 4, want{true, 0, 0}},
		}
	case weir.SlidingLog:
		steps = []step{
			{0, 2, want{true, 2, 0}},
			{2 * u, 1, want{true, 1, 0}}, {2 * u, 1, want{true, 0, 0}},
			{2 * u, 1, want{false, 0, 2 * u}}, // the entries at 0 leave at 4u
			{4*u - time.Microsecond, 1, want{false, 0, time.Microsecond}},
			{4 * u, 2, want{true, 0, 0}},
			{4 * u, 1, want{false, 0, 2 * u}}, // the first entry of 2u leaves at 6u
			{4 * u, 3, want{false, 0, 4 * u}}, // the third oldest is from 4u
			{6 * u, 2, want{true, 0, 0}},
		}
	case weir.SlidingWindow:
		if t.buckets == sequenceBuckets {
			steps = bucketSteps()
			break
		}
		// Windows of 4u from the epoch; the previous window weighs
		// ceil(prev × (P−e)/P).
		steps = []step{
			{0, 4, want{true, 0, 0}},
			{0, 1, want{false, 0, 5 * u}}, // next window, when ceil(4×(P−e)/P) ≤ 3: e = u
			{4 * u, 1, want{false, 0, u}},
			{5 * u, 1, want{true, 0, 0}},                                      // weighted 3 + 1
			{5 * u, 1, want{false, 0, u}},                                     // needs weighted ≤ 2: e = 2u
			{6 * u, 1, want{true, 0, 0}},                                      // weighted 2 + 2
			{8 * u, 2, want{true, 0, 0}},                                      // weighted ceil(2×1) + 2
			{9*u + time.Microsecond, 1, want{false, 0, u - time.Microsecond}}, // weighted ceil(2×(3u−1µs)/4u) = 2, cur 2
			{10 * u, 1, want{true, 0, 0}},                                     // weighted ceil(2×2u/4u) = 1, cur 3
		}
	case weir.TokenBucket, weir.GCRA, weir.LeakyBucket:
		steps = []step{
			{0, 4, want{true, 0, 0}},
			{0, 1, want{false, 0, u}}, {0, 2, want{false, 0, 2 * u}},
			{u - time.Microsecond, 1, want{false, 0, time.Microsecond}},
			{u, 1, want{true, 0, 0}},
			{4*u + u/3, 3, want{true, 0, 0}}, // 3.33 back; 0.33 left over
			{4*u + u/3, 1, want{false, 0, u - u/3}},
			{5 * u, 1, want{true, 0, 0}},
			{20 * u, 1, want{true, 3, 0}},
		}
	case weir.Concurrency:
		// Each admitted take holds an anonymous lease for the period (4u).
		steps = []step{
			{0, 3, want{true, 1, 0}},
			{u, 1, want{true, 0, 0}},
			{2 * u, 1, want{false, 0, 2 * u}}, // the 3 leases from 0 expire at 4u
			{2 * u, 4, want{false, 0, 3 * u}}, // all four must go
			{4 * u, 3, want{true, 0, 0}},
			{4 * u, 1, want{false, 0, u}},
		}
	}
	l := t.base()
	for i, s := range steps {
		t.at(s.at)
		t.expect(fmt.Sprintf("step %d (t=%v, n=%d)", i, s.at, s.n), t.take("k", l, s.n), s.want)
	}
	if t.algo != weir.TokenBucket && t.algo != weir.GCRA && t.algo != weir.LeakyBucket {
		return
	}
	// 3 per 10s: the emission interval is 3333333⅓µs, so every step
	// carries a fraction of a microsecond that must neither be lost nor
	// overfill the bucket.
	us := time.Microsecond
	frac := weir.Limit{Algorithm: t.algo, Rate: 3, Period: 10 * time.Second}
	for i, s := range []step{
		{0, 3, want{true, 0, 0}},
		{0, 1, want{false, 0, 3333334 * us}},
		{3333334 * us, 1, want{true, 0, 0}}, // ⅔µs of credit left over
		{3333334 * us, 1, want{false, 0, 3333333 * us}},
		{6666667 * us, 1, want{true, 0, 0}}, // ⅓µs left over
		{6666667 * us, 1, want{false, 0, 3333333 * us}},
		{16666667 * us, 3, want{true, 0, 0}}, // refilled to exactly full, not ⅓µs over
		{16666667 * us, 1, want{false, 0, 3333334 * us}},
	} {
		t.at(s.at)
		t.expect(fmt.Sprintf("fractional step %d (t=%v, n=%d)", i, s.at, s.n), t.take("frac", frac, s.n), s.want)
	}
}

// bucketSteps is the sequence of a sliding window of 4 per 4u in 4 buckets
// of u: the estimate is ceil(c[b−4] × (u−e)/u) + c[b−3] + … + c[b], for
// the bucket b = floor(t/u) and e = t − b×u.
func bucketSteps() []step {
	u, us := unit, time.Microsecond
	return []step{
		{0, 4, want{true, 0, 0}},
		{0, 1, want{false, 0, 4*u + u/4}}, // in bucket 4, when ceil(4×(u−e)/u) ≤ 3: e = u/4
		{4 * u, 1, want{false, 0, u / 4}},
		{4*u + u/4, 1, want{true, 0, 0}},         // 3 + 1
		{4*u + u/4, 1, want{false, 0, u / 4}},    // needs ceil(4×(u−e)/u) ≤ 2: e = u/2
		{4*u + u/2, 1, want{true, 0, 0}},         // 2 + 2
		{8 * u, 2, want{true, 0, 0}},             // c[4] = 2 wholly weighted, + 2
		{8*u + u/2, 1, want{true, 0, 0}},         // ceil(2×½) + 2 + 1
		{8*u + u/2, 1, want{false, 0, u / 2}},    // c[4] must be wholly out: 9u
		{9*u - us, 1, want{false, 0, us}},        // ceil(2×1µs/u) = 1, + 3
		{9 * u, 1, want{true, 0, 0}},             // 0 + 3 + 1
		{12*u + us, 4, want{false, 0, 2*u - us}}, // c[8] = 3 and c[9] = 1 must both leave: 14u
		{14 * u, 4, want{true, 0, 0}},
	}
}

func (t *tester) peek() {
	l := t.base()
	for i := 0; i < 3; i++ {
		p := t.take("k", l, 0)
		t.expect("peek on a fresh key", p, want{true, 4, 0})
		if p.Granted != 0 {
			t.Fatalf("an admitted peek reports %d granted", p.Granted)
		}
	}
	t.expect("take 1", t.take("k", l, 1), want{true, 3, 0})
	t.expect("peek after one", t.take("k", l, 0), want{true, 3, 0})
	r := t.take("k", l, 3)
	if !r.Allowed || r.Remaining != 0 {
		t.Fatalf("take 3: %+v", r)
	}
	p := t.take("k", l, 0)
	if p.Allowed || p.Remaining != 0 || p.RetryAfter <= 0 {
		t.Fatalf("peek when exhausted: got %+v, want not allowed with a RetryAfter", p)
	}
	if p.Granted != 0 {
		t.Fatalf("peek granted %d", p.Granted)
	}
}

func (t *tester) weighted() {
	l := t.base()
	t.expect("take 3", t.take("k", l, 3), want{true, 1, 0})
	if r := t.take("k", l, 2); r.Allowed || r.Granted != 0 {
		t.Fatalf("take 2 of 1 left: %+v", r)
	}
	t.expect("peek", t.take("k", l, 0), want{true, 1, 0})
	t.expect("take 1", t.take("k", l, 1), want{true, 0, 0})
	if r := t.take("k2", l, 4); !r.Allowed || r.Granted != 4 || r.Remaining != 0 {
		t.Fatalf("take the whole limit at once: %+v", r)
	}
}

func (t *tester) rejectionConsumesNothing() {
	l := t.base()
	first := t.take("k", l, 4)
	if !first.Allowed {
		t.Fatalf("take 4: %+v", first)
	}
	rej := t.take("k", l, 1)
	if rej.Allowed {
		t.Fatal("5th admitted")
	}
	for i := 0; i < 20; i++ {
		r := t.take("k", l, 1)
		if r.Allowed || r.RetryAfter != rej.RetryAfter {
			t.Fatalf("rejection %d: %+v, want the same RetryAfter %v as the first (rejections must not consume)", i, r, rej.RetryAfter)
		}
	}
	t.advance(rej.RetryAfter)
	if r := t.take("k", l, 1); !r.Allowed {
		t.Fatalf("after RetryAfter %v: %+v (the rejections consumed?)", rej.RetryAfter, r)
	}
}

// retryAfterExact walks a random workload; at every rejection it checks
// that one microsecond before RetryAfter the same request is still
// rejected, one millisecond before too, and at RetryAfter it is admitted.
func (t *tester) retryAfterExact() {
	rng := rand.New(rand.NewPCG(1, uint64(len(t.algo))))
	limits := []weir.Limit{t.base(), t.limit(3, 10*time.Second), t.limit(7, 90*time.Second)}
	if t.algo == weir.TokenBucket || t.algo == weir.GCRA || t.algo == weir.LeakyBucket {
		limits = append(limits, weir.Limit{Algorithm: t.algo, Rate: 3, Period: time.Minute, Burst: 5})
	}
	for li, l := range limits {
		key := fmt.Sprintf("k%d", li)
		rejections := 0
		for i := 0; i < 200 && rejections < 25; i++ {
			n := 1 + rng.Int64N(min(3, l.Rate))
			r := t.take(key, l, n)
			if r.Allowed {
				t.advance(time.Duration(rng.Int64N(int64(l.Period / time.Duration(l.Rate)))))
				continue
			}
			rejections++
			ra := r.RetryAfter
			if ra <= 0 {
				t.Fatalf("%v: rejected with RetryAfter %v", l, ra)
			}
			if ra > time.Millisecond {
				t.advance(ra - time.Millisecond)
				if r2 := t.take(key, l, n); r2.Allowed {
					t.Fatalf("%v n=%d: admitted 1ms before RetryAfter %v", l, n, ra)
				}
				t.advance(time.Millisecond - time.Microsecond)
			} else {
				t.advance(ra - time.Microsecond)
			}
			if r2 := t.take(key, l, n); r2.Allowed {
				t.Fatalf("%v n=%d: admitted 1µs before RetryAfter %v", l, n, ra)
			} else if r2.RetryAfter != time.Microsecond {
				t.Fatalf("%v n=%d: 1µs before RetryAfter, RetryAfter is %v", l, n, r2.RetryAfter)
			}
			t.advance(time.Microsecond)
			if r2 := t.take(key, l, n); !r2.Allowed {
				t.Fatalf("%v n=%d: rejected at RetryAfter %v: %+v", l, n, ra, r2)
			}
		}
		if rejections == 0 {
			t.Fatalf("%v: the workload never hit the limit", l)
		}
	}
}

// resetAfterExact checks that the state is full again exactly at
// ResetAfter and not a microsecond before.
func (t *tester) resetAfterExact() {
	rng := rand.New(rand.NewPCG(2, uint64(len(t.algo))))
	l := t.limit(5, 40*time.Second)
	for i := 0; i < 30; i++ {
		key := fmt.Sprintf("k%d", i)
		for j := 0; j < 1+rng.IntN(6); j++ {
			t.take(key, l, 1)
			t.advance(time.Duration(rng.Int64N(int64(10 * time.Second))))
		}
		p := t.take(key, l, 0)
		if p.ResetAfter == 0 {
			if p.Remaining != p.Limit {
				t.Fatalf("ResetAfter 0 but remaining %d of %d", p.Remaining, p.Limit)
			}
			continue
		}
		t.advance(p.ResetAfter - time.Microsecond)
		if q := t.take(key, l, 0); q.Remaining >= q.Limit {
			t.Fatalf("1µs before ResetAfter %v the state is already full: %+v", p.ResetAfter, q)
		}
		t.advance(time.Microsecond)
		if q := t.take(key, l, 0); q.Remaining != q.Limit || q.ResetAfter != 0 {
			t.Fatalf("at ResetAfter %v the state is not full: %+v", p.ResetAfter, q)
		}
	}
}

func (t *tester) atMost() {
	l := t.base()
	ctx := context.Background()
	r, err := t.lim.AllowAtMost(ctx, t.key("k"), l, 3)
	if err != nil || !r.Allowed || r.Granted != 3 || r.Remaining != 1 {
		t.Fatalf("AllowAtMost 3 of 4: %+v %v", r, err)
	}
	r, err = t.lim.AllowAtMost(ctx, t.key("k"), l, 4)
	if err != nil || !r.Allowed || r.Granted != 1 || r.Remaining != 0 {
		t.Fatalf("AllowAtMost 4 of 1 left: got %+v %v, want 1 granted", r, err)
	}
	r, err = t.lim.AllowAtMost(ctx, t.key("k"), l, 2)
	if err != nil || r.Allowed || r.Granted != 0 || r.RetryAfter <= 0 {
		t.Fatalf("AllowAtMost when exhausted: %+v %v", r, err)
	}
	// Asking for more than the limit can ever hold is not an error: the
	// grant is capped.
	r, err = t.lim.AllowAtMost(ctx, t.key("big"), l, 1000)
	if err != nil || !r.Allowed || r.Granted != 4 {
		t.Fatalf("AllowAtMost 1000 of 4: got %+v %v, want 4 granted", r, err)
	}
}

func (t *tester) penaltyBox() {
	l := t.base()
	l.Block = 10 * time.Minute
	if r := t.take("k", l, 4); !r.Allowed {
		t.Fatalf("take 4: %+v", r)
	}
	p := t.take("k", l, 0)
	if p.Allowed || !p.BlockedUntil.IsZero() {
		t.Fatalf("a peek must not start the penalty box: %+v", p)
	}
	r := t.take("k", l, 1)
	wantUntil := Epoch.Add(10 * time.Minute)
	if r.Allowed || !r.BlockedUntil.Equal(wantUntil) || r.RetryAfter != 10*time.Minute || r.Remaining != 0 {
		t.Fatalf("first rejection: got %+v, want blocked until %v with RetryAfter 10m", r, wantUntil)
	}
	t.advance(5 * time.Minute) // the limit itself has long recovered
	r = t.take("k", l, 1)
	if r.Allowed || !r.BlockedUntil.Equal(wantUntil) || r.RetryAfter != 5*time.Minute || r.ResetAfter != 5*time.Minute {
		t.Fatalf("inside the penalty box: got %+v, want rejected until %v, with RetryAfter and ResetAfter 5m (the box outlasts the state)", r, wantUntil)
	}
	if p := t.take("k", l, 0); p.Allowed || !p.BlockedUntil.Equal(wantUntil) {
		t.Fatalf("peek inside the penalty box: %+v", p)
	}
	// The box binds only limits with one: under a limit without Block (as
	// after a reload that removed it) the recovered key is free.
	if p := t.take("k", t.base(), 0); !p.Allowed || !p.BlockedUntil.IsZero() {
		t.Fatalf("peek under a limit without a box, inside another limit's box: got %+v, want admitted, no box", p)
	}
	t.advance(5*time.Minute - time.Microsecond)
	if r := t.take("k", l, 1); r.Allowed || r.RetryAfter != time.Microsecond {
		t.Fatalf("1µs before the box opens: %+v", r)
	}
	t.advance(time.Microsecond)
	r = t.take("k", l, 1)
	if !r.Allowed || !r.BlockedUntil.IsZero() || r.Remaining != 3 {
		t.Fatalf("after the penalty box: got %+v, want admitted with 3 left", r)
	}
	// A penalty box shorter than the limit's own wait: RetryAfter is the later of the two.
	short := t.base()
	short.Block = 5 * time.Second
	t.take("short", short, 4)
	r1 := t.take("short", short, 1)
	if r1.Allowed || r1.RetryAfter < 5*time.Second || r1.BlockedUntil.IsZero() {
		t.Fatalf("short box, first rejection: %+v", r1)
	}
	t.advance(time.Second)
	if r2 := t.take("short", short, 1); r2.Allowed || r2.RetryAfter != max(r1.RetryAfter-time.Second, 4*time.Second) || r2.ResetAfter < r2.RetryAfter {
		t.Fatalf("short box after 1s: RetryAfter %v ResetAfter %v, want RetryAfter %v and ResetAfter no sooner", r2.RetryAfter, r2.ResetAfter, max(r1.RetryAfter-time.Second, 4*time.Second))
	}
	// Reset clears a penalty box too.
	t.take("k", l, 3)
	if r := t.take("k", l, 1); r.BlockedUntil.IsZero() {
		t.Fatalf("second lockout did not start: %+v", r)
	}
	if err := t.lim.Reset(context.Background(), t.key("k"), l); err != nil {
		t.Fatal(err)
	}
	if r := t.take("k", l, 1); !r.Allowed {
		t.Fatalf("after Reset: %+v", r)
	}
}

func (t *tester) reset() {
	l := t.base()
	t.take("k", l, 4)
	t.take("other", l, 4)
	if err := t.lim.Reset(context.Background(), t.key("k"), l); err != nil {
		t.Fatal(err)
	}
	t.expect("after Reset", t.take("k", l, 1), want{true, 3, 0})
	if r := t.take("other", l, 1); r.Allowed {
		t.Fatal("Reset of one key cleared another")
	}
	if err := t.lim.Reset(context.Background(), t.key("never-used"), l); err != nil {
		t.Fatalf("Reset of an unused key: %v", err)
	}
}

func (t *tester) badInput() {
	ctx := context.Background()
	l := t.base()
	t.take("k", l, 2)
	for _, n := range []int64{-1, -1 << 62, 5, 1 << 62} {
		_, err := t.h.Store.Take(ctx, t.key("k"), l, n)
		if !errors.Is(err, weir.ErrInvalidCost) || !strings.Contains(err.Error(), fmt.Sprint(n)) {
			t.Fatalf("Take n=%d: got %v, want ErrInvalidCost naming %d", n, err, n)
		}
	}
	bad := []weir.Limit{
		{Algorithm: t.algo, Rate: 0, Period: time.Second},
		{Algorithm: t.algo, Rate: -3, Period: time.Second},
		{Algorithm: t.algo, Rate: 3, Period: 0},
		{Algorithm: t.algo, Rate: 3, Period: -time.Second},
		{Algorithm: t.algo, Rate: 3, Period: time.Second, Block: -time.Second},
		{Algorithm: "nonsense", Rate: 3, Period: time.Second},
	}
	for _, b := range bad {
		if _, err := t.h.Store.Take(ctx, t.key("k"), b, 1); !errors.Is(err, weir.ErrInvalidLimit) {
			t.Fatalf("Take with %+v: got %v, want ErrInvalidLimit", b, err)
		}
	}
	t.expect("state after bad input", t.take("k", l, 0), want{true, 2, 0})
}

// keyIsolation checks that crafted keys neither collide nor break out.
func (t *tester) keyIsolation() {
	l := t.limit(2, time.Minute)
	keys := []string{
		"a", "a:", ":a", "a:b", "a%3Ab", "a{b}", "a%7Bb%7D", "{a}", "}{", "a\nb", "a\\b", "a\x00b", "\xff\xfe",
		"~", "%", "", strings.Repeat("x", 10_000), strings.Repeat("x", 10_000) + "y", "ключ", "a b",
		weir.Key("r", "x:y"), weir.Key("r", "x", "y"), weir.Key("r", strings.Repeat("z", 100)),
	}
	for _, k := range keys {
		if r := t.take(k, l, 2); !r.Allowed {
			t.Fatalf("key %q: first take rejected; it shares state with another key", trunc(k))
		}
	}
	for _, k := range keys {
		if r := t.take(k, l, 1); r.Allowed {
			t.Fatalf("key %q: third take admitted", trunc(k))
		}
	}
	// The same key under two algorithms has two states.
	other := weir.GCRA
	if t.algo == weir.GCRA {
		other = weir.FixedWindow
	}
	if r := t.take("a", weir.Limit{Algorithm: other, Rate: 2, Period: time.Minute}, 2); !r.Allowed {
		t.Fatalf("key under %s shares state with %s", other, t.algo)
	}
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func (t *tester) expiry() {
	if t.h.TTL == nil {
		t.Skip("the store reports no TTL")
	}
	l := t.base()
	l.Block = 7 * time.Minute
	k := t.key("k")
	if _, ok := t.h.TTL(k, l); ok {
		t.Fatal("state before any take")
	}
	t.take("k", l, 0)
	if ttl, ok := t.h.TTL(k, l); ok {
		t.Fatalf("a peek on a fresh key stored state with TTL %v", ttl)
	}
	r := t.take("k", l, 2)
	ttl, ok := t.h.TTL(k, l)
	if !ok || ttl <= 0 || ttl > r.ResetAfter+t.h.TTLSlack {
		t.Fatalf("after take: TTL %v (kept %v), want in (0, ResetAfter %v]", ttl, ok, r.ResetAfter)
	}
	t.take("k", l, 2)
	t.take("k", l, 1) // starts the penalty box
	if ttl, _ := t.h.TTL(k, l); ttl < 7*time.Minute-time.Second || ttl > 7*time.Minute+t.h.TTLSlack {
		t.Fatalf("while blocked for 7m: TTL %v", ttl)
	}
	if err := t.lim.Reset(context.Background(), k, l); err != nil {
		t.Fatal(err)
	}
	if ttl, ok := t.h.TTL(k, l); ok {
		t.Fatalf("state kept after Reset, TTL %v", ttl)
	}
}

// hammer races many goroutines on a few keys with a frozen clock (when the
// store has one) and counts: each key must admit exactly its limit.
func (t *tester) hammer() {
	const keys, goroutines, tries, rate = 3, 48, 12, 100
	l := t.limit(rate, time.Hour)
	var admitted [keys]atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, goroutines)
	start := make(chan struct{})
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			<-start
			for i := 0; i < tries; i++ {
				k := (g + i) % keys
				r, err := t.h.Store.Take(context.Background(), t.key(fmt.Sprint(k)), l, 1)
				if err != nil {
					errc <- err
					return
				}
				if r.Allowed {
					admitted[k].Add(r.Granted)
				}
			}
		}(g)
	}
	close(start)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for k := range admitted {
		// 48×12/3 = 192 attempts per key against a limit of 100.
		if got := admitted[k].Load(); got != rate {
			t.Errorf("key %d: %d admitted by %d goroutines, want exactly %d", k, got, goroutines, rate)
		}
		if r := t.take(fmt.Sprint(k), l, 0); r.Remaining != 0 {
			t.Errorf("key %d: %d remaining after the hammer, want 0", k, r.Remaining)
		}
	}
}

// batch checks TakeAll's all-or-nothing contract.
func (t *tester) batch() {
	ms := t.h.Store
	ctx := context.Background()
	wide := t.limit(10, time.Minute)
	narrow := t.limit(2, time.Minute)
	reqs := []weir.Request{{Key: t.key("wide"), Limit: wide, N: 1}, {Key: t.key("narrow"), Limit: narrow, N: 1}}
	res := make([]weir.Result, 2)
	for i := 0; i < 2; i++ {
		if err := ms.Do(ctx, reqs, res); err != nil {
			t.Fatal(err)
		}
		if !res[0].Allowed || !res[1].Allowed || res[0].Remaining != int64(9-i) || res[1].Remaining != int64(1-i) {
			t.Fatalf("batch %d: %+v", i, res)
		}
	}
	for i := 0; i < 3; i++ {
		if err := ms.Do(ctx, reqs, res); err != nil {
			t.Fatal(err)
		}
		if res[1].Allowed || res[1].RetryAfter <= 0 {
			t.Fatalf("narrow limit admitted a third: %+v", res[1])
		}
		if !res[0].Allowed || res[0].Granted != 0 {
			t.Fatalf("the wide limit alone would admit but must not consume: %+v", res[0])
		}
	}
	if r := t.take("wide", wide, 0); r.Remaining != 8 {
		t.Fatalf("rejected batches consumed from the wide limit: %d remaining, want 8", r.Remaining)
	}
	// Duplicate keys in one batch are refused.
	dup := []weir.Request{{Key: t.key("d"), Limit: wide, N: 1}, {Key: t.key("d"), Limit: wide, N: 1}}
	if err := ms.Do(ctx, dup, res); err == nil {
		t.Fatal("a batch naming one key twice was accepted")
	}
	// A bad cost anywhere fails the batch with nothing consumed.
	bad := []weir.Request{{Key: t.key("wide"), Limit: wide, N: 1}, {Key: t.key("narrow2"), Limit: narrow, N: 3}}
	if err := ms.Do(ctx, bad, res); !errors.Is(err, weir.ErrInvalidCost) {
		t.Fatalf("batch with cost 3 on a limit of 2: %v", err)
	}
	if r := t.take("wide", wide, 0); r.Remaining != 8 {
		t.Fatalf("a failed batch consumed: %d remaining, want 8", r.Remaining)
	}
}

func (t *tester) leases() {
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.Concurrency, Rate: 4, Period: time.Minute}
	k := t.key("k")
	big, r, err := t.lim.AcquireN(ctx, k, l, 3)
	if err != nil || big == nil || r.Remaining != 1 {
		t.Fatalf("AcquireN 3: %v %+v %v", big, r, err)
	}
	one, r, err := t.lim.Acquire(ctx, k, l)
	if err != nil || one == nil || r.Remaining != 0 {
		t.Fatalf("Acquire: %v %+v %v", one, r, err)
	}
	none, r, err := t.lim.Acquire(ctx, k, l)
	if err != nil || none != nil || r.Allowed || r.RetryAfter <= 0 {
		t.Fatalf("Acquire when full: %v %+v %v", none, r, err)
	}
	if err := big.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := big.Release(ctx); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if r := t.take("k", l, 0); r.Remaining != 3 {
		t.Fatalf("after releasing a lease of 3: remaining %d", r.Remaining)
	}
	if _, _, err := t.lim.Acquire(ctx, k, weir.Limit{Algorithm: weir.GCRA, Rate: 4, Period: time.Minute}); err == nil {
		t.Fatal("Acquire on a gcra limit succeeded")
	}
	if t.h.Clock != nil {
		// An unreleased lease expires after the period.
		t.advance(time.Minute)
		if r := t.take("k", l, 0); r.Remaining != 4 {
			t.Fatalf("after the lease TTL: remaining %d, want 4", r.Remaining)
		}
		if err := one.Release(ctx); err != nil {
			t.Fatalf("Release after expiry: %v", err)
		}
	}
}

// sameAsTokenBucket runs one random workload against this algorithm and
// the token bucket: GCRA and a policing leaky bucket must decide exactly
// like a token bucket of the same rate and burst.
func (t *tester) sameAsTokenBucket() {
	if t.algo != weir.GCRA && t.algo != weir.LeakyBucket {
		t.Skip("only GCRA and the leaky bucket are token-bucket equivalents")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	// A Redis key expires by real time, after the ResetAfter the test clock
	// gave it, so every limit here keeps that at seconds: a stall of a
	// loaded CI machine between two steps must not expire a key.
	for _, l := range []weir.Limit{{Rate: 3, Period: 10 * time.Second, Burst: 5}, {Rate: 7, Period: 3 * time.Second}, {Rate: 1000, Period: 700 * time.Second, Burst: 9}} {
		tb, other := l, l
		tb.Algorithm, other.Algorithm = weir.TokenBucket, t.algo
		for i := 0; i < 300; i++ {
			n := rng.Int64N(4)
			a, b := t.take("tb"+l.String(), tb, n), t.take("x"+l.String(), other, n)
			if a != b {
				t.Fatalf("%v step %d n=%d: token_bucket %+v, %s %+v", l, i, n, a, t.algo, b)
			}
			t.advance(time.Duration(rng.Int64N(int64(l.Period/time.Duration(l.Rate)))) + time.Duration(rng.Int64N(3))*time.Microsecond)
		}
	}
}

// loweredBurst: a burst lowered on a live key caps the level the bucket
// holds now, not the level it held when last written. Three events poured
// into a bucket draining 0.3 per second leave 1.5 after five seconds; a
// burst lowered to 2 holds them all, so a request of one waits until the
// level drains to 1. GCRA and the policing leaky bucket agree on this; the
// token bucket keeps tokens, not debt, and refills to the new burst.
func (t *tester) loweredBurst() {
	if t.algo != weir.GCRA && t.algo != weir.LeakyBucket {
		t.Skip("only GCRA and the leaky bucket keep a level that drains")
	}
	l := weir.Limit{Algorithm: t.algo, Rate: 3, Period: 10 * time.Second, Burst: 4}
	lo := l
	lo.Burst = 2
	if r := t.take("k", l, 3); !r.Allowed {
		t.Fatalf("3 of burst 4: %+v", r)
	}
	t.advance(5 * time.Second)
	r := t.take("k", lo, 1)
	if r.Allowed || r.Remaining != 0 || r.RetryAfter != 1666667*time.Microsecond || r.ResetAfter != 5*time.Second {
		t.Fatalf("1 under burst 2, 5s later: %+v, want rejected for 1.666667s, reset in 5s (1.5 events left)", r)
	}
	t.advance(r.RetryAfter - time.Microsecond)
	if r := t.take("k", lo, 1); r.Allowed {
		t.Fatalf("1 under burst 2, a µs before RetryAfter: %+v", r)
	}
	t.advance(time.Microsecond)
	if r := t.take("k", lo, 1); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("1 under burst 2 at RetryAfter: %+v, want admitted with none left", r)
	}

	// Four events, one second later: 3.7 left, above the new burst. That
	// reads as a full bucket (the burst of 2 takes 6.666667s to drain), but
	// the store must keep the state until all 3.7 have drained, 12.333334s
	// on: forgetting it sooner would empty the bucket early.
	if r := t.take("full", l, 4); !r.Allowed {
		t.Fatalf("4 of burst 4: %+v", r)
	}
	t.advance(time.Second)
	r = t.take("full", lo, 0)
	if r.Allowed || r.Remaining != 0 || r.RetryAfter != 3333334*time.Microsecond || r.ResetAfter != 6666667*time.Microsecond {
		t.Fatalf("a peek under burst 2 with 3.7 events left: %+v, want a full bucket", r)
	}
	if t.h.TTL != nil {
		if ttl, ok := t.h.TTL(t.key("full"), lo); !ok || ttl+t.h.TTLSlack < 12333334*time.Microsecond {
			t.Fatalf("after a peek under burst 2 with 3.7 events left: TTL %v (kept %v), want at least 12.333334s", ttl, ok)
		}
	}
}

// shaping checks the leaky bucket's delays, including nginx's two-stage
// burst/delay behaviour.
func (t *tester) shaping() {
	u := unit
	l := weir.Limit{Algorithm: weir.LeakyBucket, Rate: 4, Period: time.Minute, MaxDelay: 4 * u}
	for i, wd := range []time.Duration{0, u, 2 * u, 3 * u} {
		r := t.take("plain", l, 1)
		if !r.Allowed || r.Delay != wd {
			t.Fatalf("request %d: got %+v, want delay %v", i, r, wd)
		}
	}
	if r := t.take("plain", l, 1); r.Allowed || r.RetryAfter != u {
		t.Fatalf("5th: %+v", r)
	}
	// MaxDelay caps the queue below the burst.
	l2 := weir.Limit{Algorithm: weir.LeakyBucket, Rate: 4, Period: time.Minute, MaxDelay: u + u/2}
	t.take("capped", l2, 1)
	t.take("capped", l2, 1)
	r := t.take("capped", l2, 1)
	if r.Allowed || r.RetryAfter != u/2 {
		t.Fatalf("3rd with max delay 1.5u: %+v, want rejected for %v", r, u/2)
	}
	t.advance(u / 2)
	if r := t.take("capped", l2, 1); !r.Allowed || r.Delay != u+u/2 {
		t.Fatalf("3rd at RetryAfter: %+v, want delay %v", r, u+u/2)
	}
	// A fractional interval (10s/3): delays round up, never down.
	l4 := weir.Limit{Algorithm: weir.LeakyBucket, Rate: 3, Period: 10 * time.Second, MaxDelay: time.Hour}
	for i, wd := range []time.Duration{0, 3333334 * time.Microsecond, 6666667 * time.Microsecond} {
		if r := t.take("frac", l4, 1); !r.Allowed || r.Delay != wd {
			t.Fatalf("fractional request %d: got %+v, want delay %v", i, r, wd)
		}
	}
	// nginx "burst=5 delay=2": 3 pass at once, the rest are delayed.
	t.at(0)
	l3 := weir.Limit{Algorithm: weir.LeakyBucket, Rate: 4, Period: time.Minute, Burst: 6, DelayAfter: 3, MaxDelay: time.Hour}
	for i, wd := range []time.Duration{0, 0, 0, u, 2 * u, 3 * u} {
		if r := t.take("twostage", l3, 1); !r.Allowed || r.Delay != wd {
			t.Fatalf("two-stage request %d: got %+v, want delay %v", i, r, wd)
		}
	}
	if r := t.take("twostage", l3, 1); r.Allowed {
		t.Fatalf("two-stage 7th admitted: %+v", r)
	}
}
