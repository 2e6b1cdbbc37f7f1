// Package eventtest checks that a store records each threshold event
// exactly once per key, threshold and window, however many instances
// and goroutines decide at once.
package eventtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/events"
	"github.com/weir-dev/weir/internal/override"
)

// Size is how hard Exact drives the stores.
type Size struct {
	Goroutines int // per instance
	Identities int
}

// Exact drives every instance (several stores on one backend, or one
// store given several times) with sz.Goroutines goroutines each, which
// together take each of sz.Identities identities past a limit of 10 per
// hour under rule (thresholds 0.5, 0.8, 1.0), and checks that exactly one
// event per identity, threshold and window was recorded, and one first
// refusal.
func Exact(t *testing.T, rule string, instances []weir.Store, sz Size) {
	t.Helper()
	ctx := context.Background()
	rules := map[string]events.Rule{rule: {Thresholds: []float64{0.5, 0.8, 1.0}}}
	evs := make([]events.Store, len(instances))
	for i, s := range instances {
		e, ok := events.Of(s)
		if !ok {
			t.Fatalf("%T records no events", s)
		}
		if err := e.SetEventRules(rules); err != nil {
			t.Fatal(err)
		}
		evs[i] = e
	}
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Hour}
	const calls = 13 // 10 admitted, 3 refused
	// The work: each identity's calls side by side, so that goroutines
	// race on the same key.
	work := make(chan string, sz.Identities*calls)
	order := rand.Perm(sz.Identities)
	for _, i := range order {
		for range calls {
			work <- weir.Key(rule, fmt.Sprintf("id%d", i))
		}
	}
	close(work)
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	admitted := make([]int64, len(instances))
	var mu sync.Mutex
	for si, s := range instances {
		for range sz.Goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var n int64
				for k := range work {
					res, err := s.Take(ctx, k, l, 1)
					if err != nil {
						select {
						case errs <- err:
						default:
						}
						return
					}
					if res.Allowed {
						n++
					}
				}
				mu.Lock()
				admitted[si] += n
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	var total int64
	for _, n := range admitted {
		total += n
	}
	// Read every event, paging with since.
	var all []events.Event
	since := ""
	for {
		page, err := evs[0].Events(ctx, since, events.MaxList)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range page {
			if want := uint64(len(all) + i + 1); e.Seq != want {
				t.Fatalf("event %d has seq %d: events were dropped or numbered twice", want, e.Seq)
			}
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		since = page[len(page)-1].ID
	}
	type slot struct {
		key       string
		kind      string
		threshold float64
		window    int64
	}
	seen := map[slot]int{}
	perKey := map[string]int{}
	windows := map[int64]bool{}
	for _, e := range all {
		if e.Rule != rule {
			t.Fatalf("event of rule %q, want %q", e.Rule, rule)
		}
		w := e.Time.UnixMicro() / l.Period.Microseconds()
		windows[w] = true
		seen[slot{e.Key, e.Kind, e.Threshold, w}]++
		perKey[e.Key]++
	}
	for s, n := range seen {
		if n != 1 {
			t.Fatalf("%s %s %v in window %d: %d events, want 1", s.key, s.kind, s.threshold, s.window, n)
		}
	}
	if len(windows) == 1 {
		// The usual case: all in one window, so each identity has
		// exactly three thresholds and one refusal, and the limit held.
		if total != int64(sz.Identities)*10 {
			t.Fatalf("admitted %d, want %d", total, sz.Identities*10)
		}
		if len(all) != sz.Identities*4 {
			t.Fatalf("%d events, want %d (3 thresholds and a refusal for each of %d identities)", len(all), sz.Identities*4, sz.Identities)
		}
	}
	for _, i := range order {
		k := fmt.Sprintf("id%d", i)
		if perKey[k] < 4 {
			t.Fatalf("%s: %d events, want at least 4", k, perKey[k])
		}
	}
}

// collect reads every event the store keeps, in order.
func collect(t *testing.T, es events.Store) []events.Event {
	t.Helper()
	var all []events.Event
	since := ""
	for {
		page, err := es.Events(context.Background(), since, events.MaxList)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		since = page[len(page)-1].ID
	}
}

// sweepAll sweeps from every instance at once, each until it finds
// nothing more.
func sweepAll(t *testing.T, evs []events.Store) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(evs)*4)
	for _, e := range evs {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					n, err := e.Sweep(context.Background())
					if err != nil {
						errs <- err
						return
					}
					if n == 0 {
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Boxes drives every instance with sz.Goroutines goroutines each into
// the penalty box of each of sz.Identities identities (a limit of 3 per
// hour under rule, box 1 minute), and checks one blocked event per
// identity; then, advance having moved the store's clock past the box,
// sweeps from every instance at once (4 goroutines each) and checks one
// unblocked event per identity at the box's end. A second round boxes
// every identity again; half of them are then decided on after their
// box ended and before any sweep, which announces the end itself, and
// the sweep after must not announce it again.
func Boxes(t *testing.T, rule string, instances []weir.Store, advance func(time.Duration), sz Size) {
	t.Helper()
	ctx := context.Background()
	rules := map[string]events.Rule{rule: {Thresholds: []float64{1.0}}}
	evs := make([]events.Store, len(instances))
	for i, s := range instances {
		e, ok := events.Of(s)
		if !ok {
			t.Fatalf("%T records no events", s)
		}
		if err := e.SetEventRules(rules); err != nil {
			t.Fatal(err)
		}
		evs[i] = e
	}
	l := weir.Limit{Algorithm: weir.SlidingWindow, Rate: 3, Period: time.Hour, Block: time.Minute}
	drive := func(calls int) {
		t.Helper()
		work := make(chan string, sz.Identities*calls)
		for _, i := range rand.Perm(sz.Identities) {
			for range calls {
				work <- weir.Key(rule, fmt.Sprintf("id%d", i))
			}
		}
		close(work)
		var wg sync.WaitGroup
		errs := make(chan error, 1)
		for _, s := range instances {
			for range sz.Goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := range work {
						if _, err := s.Take(ctx, k, l, 1); err != nil {
							select {
							case errs <- err:
							default:
							}
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	count := func(want map[string]int) {
		t.Helper()
		got := map[string]int{}
		for _, e := range collect(t, evs[0]) {
			if e.Kind == events.KindBlocked || e.Kind == events.KindUnblocked {
				got[e.Kind]++
			}
		}
		for k, n := range want {
			if got[k] != n {
				t.Fatalf("%d %s events, want %d (all: %v)", got[k], k, n, got)
			}
		}
	}
	ids := sz.Identities
	drive(6) // 3 admitted, then a refusal boxes the key; the rest are refused in the box
	count(map[string]int{events.KindBlocked: ids, events.KindUnblocked: 0})
	sweepAll(t, evs)
	count(map[string]int{events.KindBlocked: ids, events.KindUnblocked: 0}) // nothing due yet
	advance(time.Minute + time.Second)
	sweepAll(t, evs)
	count(map[string]int{events.KindBlocked: ids, events.KindUnblocked: ids})
	// Round two: the window still holds 3, so one call boxes again.
	drive(1)
	count(map[string]int{events.KindBlocked: 2 * ids, events.KindUnblocked: ids})
	advance(time.Minute + time.Second)
	// Half are decided on before the sweep: that decision announces the
	// end of their box (and boxes them a third time).
	half := ids / 2
	for i := range half {
		if _, err := instances[i%len(instances)].Take(ctx, weir.Key(rule, fmt.Sprintf("id%d", i)), l, 1); err != nil {
			t.Fatal(err)
		}
	}
	count(map[string]int{events.KindBlocked: 2*ids + half, events.KindUnblocked: ids + half})
	sweepAll(t, evs)
	count(map[string]int{events.KindBlocked: 2*ids + half, events.KindUnblocked: 2 * ids})
	advance(time.Minute + time.Second)
	sweepAll(t, evs)
	count(map[string]int{events.KindBlocked: 2*ids + half, events.KindUnblocked: 2*ids + half})
	// Every identity's events alternate blocked, unblocked.
	last := map[string]string{}
	for _, e := range collect(t, evs[0]) {
		switch e.Kind {
		case events.KindBlocked:
			if last[e.Key] == events.KindBlocked {
				t.Fatalf("%s blocked twice without leaving", e.Key)
			}
			last[e.Key] = e.Kind
		case events.KindUnblocked:
			if last[e.Key] != events.KindBlocked {
				t.Fatalf("%s unblocked without a box", e.Key)
			}
			last[e.Key] = e.Kind
		}
	}
}

// Expiries sets n overrides with an until on the store (half of them
// then moved to a later until, a quarter deleted), advances the store's
// clock past each until in turn and sweeps from every instance at once,
// checking exactly one override_expired event per override still set, at
// its until.
func Expiries(t *testing.T, rule string, ovr override.Store, instances []weir.Store, now func() time.Time, advance func(time.Duration), n int) {
	t.Helper()
	ctx := context.Background()
	evs := make([]events.Store, len(instances))
	for i, s := range instances {
		e, ok := events.Of(s)
		if !ok {
			t.Fatalf("%T records no events", s)
		}
		if err := e.SetEventRules(map[string]events.Rule{rule: {Thresholds: []float64{1.0}}}); err != nil {
			t.Fatal(err)
		}
		evs[i] = e
	}
	lim, err := weir.ParseLimit("20/m")
	if err != nil {
		t.Fatal(err)
	}
	first := now().Add(time.Minute).Truncate(time.Second)
	want := map[string]time.Time{}
	for i := range n {
		key := weir.Key(rule, fmt.Sprintf("id%d", i))
		if i%10 == 0 {
			key = weir.Key(rule, fmt.Sprintf("team%d-", i)) + "*"
		}
		if err := ovr.SetOverride(ctx, override.Override{Key: key, Limit: lim, Until: first}); err != nil {
			t.Fatal(err)
		}
		want[events.IdentityOf(key)] = first
	}
	for i := range n {
		key := weir.Key(rule, fmt.Sprintf("id%d", i))
		if i%10 == 0 {
			key = weir.Key(rule, fmt.Sprintf("team%d-", i)) + "*"
		}
		switch i % 4 {
		case 1:
			later := first.Add(time.Hour)
			if err := ovr.SetOverride(ctx, override.Override{Key: key, Limit: lim, Until: later}); err != nil {
				t.Fatal(err)
			}
			want[events.IdentityOf(key)] = later
		case 2:
			if _, err := ovr.DeleteOverride(ctx, key); err != nil {
				t.Fatal(err)
			}
			delete(want, events.IdentityOf(key))
		case 3:
			// Set again as it was: still one expiry.
			if err := ovr.SetOverride(ctx, override.Override{Key: key, Limit: lim, Until: first}); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(by time.Time) {
		t.Helper()
		got := map[string]time.Time{}
		for _, e := range collect(t, evs[0]) {
			if e.Kind != events.KindOverrideExpired {
				continue
			}
			if _, dup := got[e.Key]; dup {
				t.Fatalf("override %s expired twice", e.Key)
			}
			if e.Rule != rule {
				t.Fatalf("event of rule %q, want %q", e.Rule, rule)
			}
			got[e.Key] = e.Time
		}
		for k, at := range want {
			g, ok := got[k]
			if at.After(by) {
				if ok {
					t.Fatalf("override %s expired at %v, before its until %v", k, g, at)
				}
				continue
			}
			if !ok || !g.Equal(at) {
				t.Fatalf("override %s: expiry event %v (recorded %v), want one at %v", k, g, ok, at)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Fatalf("override %s expired but was deleted", k)
			}
		}
	}
	sweepAll(t, evs)
	check(now())
	advance(first.Sub(now()) + time.Second)
	sweepAll(t, evs)
	check(now())
	advance(time.Hour)
	sweepAll(t, evs)
	check(now())
}
