package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/events"
	"github.com/weir-dev/weir/internal/events/eventtest"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/storetest"
)

func eventSize() eventtest.Size {
	if testing.Short() && os.Getenv("WEIR_EVENTS_FULL") == "" {
		return eventtest.Size{Goroutines: 8, Identities: 200}
	}
	return eventtest.Size{Goroutines: 64, Identities: 1000}
}

// Four instances on one Redis, 64 goroutines each: one event per
// identity, threshold and window.
func TestEventsExact(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Epoch) // one window, whatever the wall clock does
	var stores []weir.Store
	for range 4 {
		stores = append(stores, newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "ev", Clock: clock.Now}))
	}
	eventtest.Exact(t, "api", stores, eventSize())
}

// The same through EVAL scripts, on a store without Functions.
func TestEventsExactEval(t *testing.T) {
	srv := redistest.Standalone(t)
	var stores []weir.Store
	clock := storetest.NewClock(storetest.Epoch)
	for range 2 {
		stores = append(stores, newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "ev", evalOnly: true, Clock: clock.Now}))
	}
	eventtest.Exact(t, "api", stores, eventtest.Size{Goroutines: 4, Identities: 50})
}

// A sliding algorithm's usage dips and rises: within the period started
// by the first crossing the threshold does not fire again; after it, it
// does. A peek never fires a refusal.
func TestEventsWindowSliding(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Epoch)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Clock: clock.Now, Prefix: "ev"})
	if err := (eventsOf{s}).SetEventRules(map[string]events.Rule{"r": {Thresholds: []float64{0.5}}}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: 10 * time.Second}
	k := weir.Key("r", "x")
	take := func(n int64) {
		t.Helper()
		if _, err := s.Take(ctx, k, l, n); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		t.Helper()
		evs, err := (eventsOf{s}).Events(ctx, "", 100)
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}
	take(5)
	if n := count(); n != 1 {
		t.Fatalf("%d events after the first crossing, want 1", n)
	}
	clock.Advance(4 * time.Second)
	take(4)
	if n := count(); n != 1 {
		t.Fatalf("%d events after a second crossing in the window, want 1", n)
	}
	clock.Advance(10 * time.Second)
	take(5)
	if n := count(); n != 2 {
		t.Fatalf("%d events after a crossing in a new window, want 2", n)
	}
	take(5)
	take(0)
	if n := count(); n != 2 {
		t.Fatalf("%d events after a peek, want 2", n)
	}
	take(1)
	take(1)
	evs, _ := (eventsOf{s}).Events(ctx, "", 100)
	if len(evs) != 3 || evs[2].Kind != events.KindRefused || evs[2].Key != "x" || evs[2].Rule != "r" || evs[0].Threshold != 0.5 {
		t.Fatalf("events %+v, want two crossings of 0.5 and the first refusal", evs)
	}
	// since= pages.
	rest, err := (eventsOf{s}).Events(ctx, evs[0].ID, 1)
	if err != nil || len(rest) != 1 || rest[0].ID != evs[1].ID {
		t.Fatalf("Events(since first, 1) = %+v, %v; want the second", rest, err)
	}
	if _, err := (eventsOf{s}).Events(ctx, "nonsense", 1); err == nil {
		t.Fatal("Events(since=nonsense) did not fail")
	}
}

// Events on a Cluster are refused, clearly.
func TestEventsClusterRefused(t *testing.T) {
	s := &Store{cluster: true}
	err := (eventsOf{s}).SetEventRules(map[string]events.Rule{"r": {Thresholds: []float64{1}}})
	if !errors.Is(err, weir.ErrUnsupported) {
		t.Fatalf("SetEventRules on a cluster = %v, want ErrUnsupported", err)
	}
}

// Two instances deliver through the consumer group to a receiver that
// fails every other call: every event arrives, by idempotency key.
func TestEventsGroupDelivery(t *testing.T) {
	srv := redistest.Standalone(t)
	secret := []byte("k")
	var mu sync.Mutex
	got := map[string]bool{}
	var calls atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := events.Verify(secret, r.Header.Get(events.SignatureHeader), body, time.Now(), time.Hour); err != nil {
			t.Error(err)
		}
		if calls.Add(1)%2 == 1 {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		mu.Lock()
		got[r.Header.Get(events.IdempotencyHeader)] = true
		mu.Unlock()
	}))
	defer hook.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var stores []*Store
	for i := range 2 {
		s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "ev"})
		if err := (eventsOf{s}).SetEventRules(map[string]events.Rule{"api": {Thresholds: []float64{0.5, 1}}}); err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
		d := &events.Deliverer{Source: eventsOf{s}.Group(fmt.Sprint("c", i)), URL: func(string) string { return hook.URL },
			Secret: func() []byte { return secret }, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Poll: time.Millisecond}
		wg.Add(1)
		go func() { defer wg.Done(); d.Run(ctx) }()
	}
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 4, Period: time.Hour}
	for i := range 100 {
		for j := range 5 {
			if _, err := stores[j%2].Take(ctx, weir.Key("api", fmt.Sprint(i)), l, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	all, err := (eventsOf{stores[0]}).Events(ctx, "", events.MaxList)
	if err != nil || len(all) != 300 {
		t.Fatalf("%d events, %v; want 300", len(all), err)
	}
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == len(all) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d events delivered", n, len(all))
		}
	}
	for _, e := range all {
		if !got[e.ID] {
			t.Fatalf("event %s not delivered", e.ID)
		}
	}
}

// Batches of two rules (one with events) on two instances: the batch's
// events are recorded after it, still once per key, threshold and window.
func TestEventsBatchExact(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	var stores []*Store
	for i := range 2 {
		// One with Functions, one with EVAL scripts.
		s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "ev", evalOnly: i == 1})
		if err := (eventsOf{s}).SetEventRules(map[string]events.Rule{"api": {Thresholds: []float64{0.5, 0.8, 1}}}); err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	lim := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Hour}
	wide := weir.Limit{Algorithm: weir.GCRA, Rate: 1000, Period: time.Hour}
	const ids, calls = 50, 13
	work := make(chan int, ids*calls)
	for i := range ids {
		for range calls {
			work <- i
		}
	}
	close(work)
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				reqs := []weir.Request{
					{Key: weir.Key("api", fmt.Sprint("id", i)), Limit: lim, N: 1},
					{Key: weir.Key("other", fmt.Sprint("id", i)), Limit: wide, N: 1},
				}
				res := make([]weir.Result, 2)
				if err := stores[g%2].Do(ctx, reqs, res); err != nil {
					t.Error(err)
					return
				}
				if res[0].Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	all, err := (eventsOf{stores[0]}).Events(ctx, "", events.MaxList)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, e := range all {
		if e.Rule != "api" {
			t.Fatalf("event of rule %q", e.Rule)
		}
		seen[fmt.Sprint(e.Key, e.Kind, e.Threshold)]++
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("%s: %d events, want 1", k, n)
		}
	}
	if admitted.Load() != ids*10 || len(all) != ids*4 {
		t.Fatalf("admitted %d, %d events; want %d and %d", admitted.Load(), len(all), ids*10, ids*4)
	}
}

// Penalty boxes on four instances: one blocked and one unblocked event
// per identity and box, every instance sweeping at once.
func TestEventsBoxes(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Epoch)
	var stores []weir.Store
	for range 4 {
		stores = append(stores, newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "ev", Clock: clock.Now, Timeout: 10 * time.Second}))
	}
	eventtest.Boxes(t, "api", stores, clock.Advance, eventSize())
}

// Override expiries on two instances: one event per override at its
// until, whichever instance sweeps.
func TestEventsOverrideExpiry(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Epoch)
	var stores []weir.Store
	for range 2 {
		stores = append(stores, newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "ev", Clock: clock.Now, Overrides: true, Timeout: 10 * time.Second}))
	}
	eventtest.Expiries(t, "api", stores[0].(*Store), stores, clock.Now, clock.Advance, 200)
}

// A batch's events are recorded by the batch's own script call: one
// FCALL (or EVALSHA) per batch, whatever fires, and the events of a batch
// that entered a penalty box are all there.
func TestEventsBatchOneCall(t *testing.T) {
	for _, eval := range []bool{false, true} {
		t.Run(fmt.Sprint("eval=", eval), func(t *testing.T) {
			srv := redistest.Standalone(t)
			s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "ev", Timeout: 10 * time.Second, evalOnly: eval})
			if err := (eventsOf{s}).SetEventRules(map[string]events.Rule{"a": {Thresholds: []float64{0.5, 1}}, "b": {Thresholds: []float64{1}}}); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			la := weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Period: 24 * time.Hour}
			lb := weir.Limit{Algorithm: weir.SlidingWindow, Rate: 4, Period: 24 * time.Hour, Block: time.Hour}
			lq := weir.Limit{Algorithm: weir.TokenBucket, Rate: 100, Period: time.Hour}
			reqs := []weir.Request{
				{Key: weir.Key("a", "x"), Limit: la, N: 1},
				{Key: weir.Key("b", "x"), Limit: lb, N: 2},
				{Key: weir.Key("quiet", "x"), Limit: lq, N: 1},
			}
			res := make([]weir.Result, len(reqs))
			if err := s.Do(ctx, reqs, res); err != nil { // warm the scripts
				t.Fatal(err)
			}
			if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
				t.Fatal(err)
			}
			const batches = 3 // a at 2/2, b at 4/4; then both refuse and b boxes; then b is boxed
			for range batches {
				if err := s.Do(ctx, reqs, res); err != nil {
					t.Fatal(err)
				}
			}
			calls := commandCalls(t, srv)
			if n := calls["fcall"] + calls["evalsha"] + calls["eval"]; n != batches {
				t.Fatalf("%d script calls for %d batches: %v", n, batches, calls)
			}
			evs, err := (eventsOf{s}).Events(ctx, "", 100)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range evs {
				got = append(got, fmt.Sprint(e.Rule, " ", e.Kind, " ", e.Threshold))
			}
			want := "a threshold 0.5 a threshold 1 b threshold 1 a refused 0 b refused 0 b blocked 0"
			if g := strings.Join(got, " "); g != want {
				t.Fatalf("events:\n got %s\nwant %s", g, want)
			}
		})
	}
}
