package redisstore

import (
	"context"
	"errors"
	"os"
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
	var stores []weir.Store
	for range 4 {
		stores = append(stores, newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "ev"}))
	}
	eventtest.Exact(t, "api", stores, eventSize())
}

// The same through EVAL scripts, on a store without Functions.
func TestEventsExactEval(t *testing.T) {
	srv := redistest.Standalone(t)
	var stores []weir.Store
	for range 2 {
		stores = append(stores, newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "ev", evalOnly: true}))
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
	if len(evs) != 3 || evs[2].Kind != events.KindRefused || evs[2].Key != k || evs[2].Rule != "r" || evs[0].Threshold != 0.5 {
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
