package memstore_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/events"
	"github.com/weir-dev/weir/internal/events/eventtest"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

func eventSize() eventtest.Size {
	if testing.Short() && os.Getenv("WEIR_EVENTS_FULL") == "" {
		return eventtest.Size{Goroutines: 8, Identities: 200}
	}
	return eventtest.Size{Goroutines: 64, Identities: 1000}
}

func TestEventsExact(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch) // one window, whatever the wall clock does
	s := memstore.New(memstore.WithClock(clock.Now))
	eventtest.Exact(t, "api", []weir.Store{s, s, s, s}, eventSize())
}

// A sliding algorithm's usage dips and rises: within the period started
// by the first crossing, the threshold does not fire again; after it, it
// does.
func TestEventsWindowSliding(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := memstore.New(memstore.WithClock(func() time.Time { return now }))
	if err := ev(t, s).SetEventRules(map[string]events.Rule{"r": {Thresholds: []float64{0.5}}}); err != nil {
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
		evs, err := ev(t, s).Events(ctx, "", 100)
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}
	take(5) // 5 of 10 used: crosses 50%
	if n := count(); n != 1 {
		t.Fatalf("%d events after the first crossing, want 1", n)
	}
	now = now.Add(4 * time.Second) // 4 tokens back: 1 used
	take(4)                        // 5 used again: a second crossing in the same window
	if n := count(); n != 1 {
		t.Fatalf("%d events after a second crossing in the window, want 1", n)
	}
	now = now.Add(10 * time.Second) // the window is over; the bucket full
	take(5)
	if n := count(); n != 2 {
		t.Fatalf("%d events after a crossing in a new window, want 2", n)
	}
	// A peek never fires the refusal; a refused take does, once.
	take(5)
	take(0)
	if n := count(); n != 2 {
		t.Fatalf("%d events after a peek, want 2", n)
	}
	take(1)
	take(1)
	evs, _ := ev(t, s).Events(ctx, "", 100)
	if len(evs) != 3 || evs[2].Kind != events.KindRefused || evs[2].Key != "x" || evs[2].Rule != "r" {
		t.Fatalf("events %+v, want a third: the first refusal", evs)
	}
}

// Rules without events record nothing, and a store without rules
// answers an empty list.
func TestEventsOff(t *testing.T) {
	s := memstore.New()
	ctx := context.Background()
	l := weir.PerMinute(weir.FixedWindow, 2)
	for range 3 {
		s.Take(ctx, weir.Key("other", "x"), l, 1)
	}
	if evs, err := ev(t, s).Events(ctx, "", 10); err != nil || len(evs) != 0 {
		t.Fatalf("Events = %v, %v; want none", evs, err)
	}
	if err := ev(t, s).SetEventRules(map[string]events.Rule{"r": {Thresholds: []float64{1}}}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s.Take(ctx, weir.Key("other", "x"), l, 1)
	}
	if evs, err := ev(t, s).Events(ctx, "", 10); err != nil || len(evs) != 0 {
		t.Fatalf("Events = %v, %v; want none for a rule without events", evs, err)
	}
	if _, err := ev(t, s).Events(ctx, "nonsense", 10); err == nil {
		t.Fatal("Events(since=nonsense) did not fail")
	}
	if err := ev(t, s).SetEventRules(map[string]events.Rule{"r": {Thresholds: []float64{0.9, 0.5}}}); err == nil {
		t.Fatal("descending thresholds were taken")
	}
}

func ev(t *testing.T, s *memstore.Store) events.Store {
	t.Helper()
	e, ok := events.Of(s)
	if !ok {
		t.Fatal("memstore records no events")
	}
	return e
}

// Penalty boxes: one blocked and one unblocked event per identity and
// box, four goroutines sweeping at once.
func TestEventsBoxes(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	s := memstore.New(memstore.WithClock(clock.Now))
	eventtest.Boxes(t, "api", []weir.Store{s, s, s, s}, clock.Advance, eventSize())
}

// Override expiries: one event per override at its until.
func TestEventsOverrideExpiry(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	s := memstore.New(memstore.WithClock(clock.Now))
	eventtest.Expiries(t, "api", s, []weir.Store{s, s}, clock.Now, clock.Advance, 200)
}
