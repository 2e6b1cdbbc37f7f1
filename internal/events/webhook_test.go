package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/events"
	"github.com/weir-dev/weir/store/memstore"
)

var secret = []byte("s3cret")

func TestSignVerify(t *testing.T) {
	body := []byte(`{"id":"1-1"}`)
	now := time.Unix(1_700_000_000, 0)
	h := events.Sign(secret, now, body)
	if err := events.Verify(secret, h, body, now.Add(time.Minute), 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := events.Verify([]byte("other"), h, body, now, 5*time.Minute); err == nil {
		t.Fatal("a signature verified under another secret")
	}
	if err := events.Verify(secret, h, []byte(`{"id":"1-2"}`), now, 5*time.Minute); err == nil {
		t.Fatal("a signature verified over another body")
	}
	if err := events.Verify(secret, h, body, now.Add(time.Hour), 5*time.Minute); err == nil {
		t.Fatal("a stale signature verified")
	}
	if err := events.Verify(secret, "garbage", body, now, 5*time.Minute); err == nil {
		t.Fatal("a malformed header verified")
	}
}

// receiver records what it is sent, by idempotency key, after checking
// each call's signature; fail decides which calls it refuses.
type receiver struct {
	t     *testing.T
	mu    sync.Mutex
	got   map[string]events.Event
	calls atomic.Int64
	fail  func(call int64) bool
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := rc.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	if err := events.Verify(secret, r.Header.Get(events.SignatureHeader), body, time.Now(), time.Hour); err != nil {
		rc.t.Errorf("call %d: %v", n, err)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if rc.fail != nil && rc.fail(n) {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	var e events.Event
	if err := json.Unmarshal(body, &e); err != nil {
		rc.t.Errorf("call %d: %v", n, err)
		return
	}
	if k := r.Header.Get(events.IdempotencyHeader); k != e.ID {
		rc.t.Errorf("Idempotency-Key %q, event id %q", k, e.ID)
	}
	rc.mu.Lock()
	rc.got[e.ID] = e
	rc.mu.Unlock()
}

func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.got)
}

type counters struct {
	mu                sync.Mutex
	kinds, deliveries map[string]int
	dropped           int64
}

func newCounters() *counters {
	return &counters{kinds: map[string]int{}, deliveries: map[string]int{}}
}
func (c *counters) Event(kind string)      { c.mu.Lock(); c.kinds[kind]++; c.mu.Unlock() }
func (c *counters) Delivery(result string) { c.mu.Lock(); c.deliveries[result]++; c.mu.Unlock() }
func (c *counters) Dropped(n int64)        { c.mu.Lock(); c.dropped += n; c.mu.Unlock() }

// drive takes ids identities of rule past a limit of 4, which fires two
// thresholds and a refusal each, and returns how many events that is.
func drive(t *testing.T, s weir.Store, rule string, ids int) int {
	t.Helper()
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 4, Period: time.Hour}
	for i := range ids {
		for range 5 {
			if _, err := s.Take(ctx, weir.Key(rule, fmt.Sprint(i)), l, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ids * 3
}

func eventsStore(t *testing.T, s weir.Store, rule string) events.Store {
	t.Helper()
	e, ok := events.Of(s)
	if !ok {
		t.Fatalf("%T records no events", s)
	}
	if err := e.SetEventRules(map[string]events.Rule{rule: {Thresholds: []float64{0.5, 1}}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// waitFor polls cond until it holds; the bound is generous (a loaded
// machine), never a timing assertion.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// A receiver that fails every other call still ends with every event,
// each under its own idempotency key.
func TestDeliverHalfFailing(t *testing.T) {
	s := memstore.New()
	ev := eventsStore(t, s, "api")
	rc := &receiver{t: t, got: map[string]events.Event{}, fail: func(n int64) bool { return n%2 == 1 }}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	cs := newCounters()
	d := &events.Deliverer{
		Source: &events.Cursor{Store: ev}, URL: func(rule string) string { return srv.URL },
		Secret: func() []byte { return secret }, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Poll: time.Millisecond, Counters: cs,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	want := drive(t, s, "api", 100)
	// Both sides: the receiver has every event, and the deliverer has
	// read every answer (a cancel between the two would count the last
	// delivery as failed though the receiver has it).
	waitFor(t, "every event delivered", func() bool {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		return rc.count() >= want && cs.deliveries[events.ResultDelivered] >= want
	})
	cancel()
	<-done
	all, err := ev.Events(context.Background(), "", events.MaxList)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != want || rc.count() != want {
		t.Fatalf("store has %d events, receiver %d; want %d", len(all), rc.count(), want)
	}
	for _, e := range all {
		got, ok := rc.got[e.ID]
		if !ok || got.Key != e.Key || got.Kind != e.Kind || got.Threshold != e.Threshold {
			t.Fatalf("event %+v delivered as %+v", e, got)
		}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.deliveries[events.ResultDelivered] != want || cs.deliveries[events.ResultFailed] < want {
		t.Fatalf("deliveries %v; want %d delivered and as many failed", cs.deliveries, want)
	}
	if cs.kinds[events.KindThreshold] != 200 || cs.kinds[events.KindRefused] != 100 {
		t.Fatalf("kinds %v", cs.kinds)
	}
}

// A receiver that hangs delays delivery only: decisions go on, every one
// of them completes, while the receiver still holds its first call.
func TestDeliverHangingReceiver(t *testing.T) {
	s := memstore.New()
	ev := eventsStore(t, s, "api")
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	var inHandler atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inHandler.Add(1)
		defer inHandler.Add(-1)
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-release
	}))
	defer srv.Close()
	defer close(release)
	d := &events.Deliverer{
		Source: &events.Cursor{Store: ev}, URL: func(string) string { return srv.URL },
		Secret: func() []byte { return secret }, Timeout: time.Hour, Poll: time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	drive(t, s, "api", 1) // the first events: the receiver takes the call and hangs
	<-arrived
	// While it hangs: 2,000 identities, 10,000 decisions, all complete.
	var completed atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 4, Period: time.Hour}
			for i := range 500 {
				for range 5 {
					if _, err := s.Take(context.Background(), weir.Key("api", fmt.Sprint(g, "/", i)), l, 1); err == nil {
						completed.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if c := completed.Load(); c != 10000 {
		t.Fatalf("%d decisions completed, want 10000", c)
	}
	if inHandler.Load() != 1 {
		t.Fatalf("%d calls in the receiver, want the one hanging", inHandler.Load())
	}
	all, _ := ev.Events(context.Background(), "", events.MaxList)
	if len(all) < 1000 {
		t.Fatalf("%d events recorded while the receiver hung", len(all))
	}
}

// ringStore keeps events in a small ring, to see drops counted.
type ringStore struct{ r *events.Ring }

func (r ringStore) SetEventRules(map[string]events.Rule) error { return nil }
func (r ringStore) Sweep(context.Context) (int, error)         { return 0, nil }
func (r ringStore) Events(ctx context.Context, since string, n int) ([]events.Event, error) {
	return r.r.Since(since, n)
}

// Events the bound drops while delivery lags are counted.
func TestDeliverCountsDropped(t *testing.T) {
	ring := events.NewRing(5)
	add := func(n int) {
		for range n {
			ring.Add(events.Event{Time: time.Now(), Rule: "r", Key: "r:x", Kind: events.KindRefused})
		}
	}
	add(3)
	cur := &events.Cursor{Store: ringStore{ring}}
	var delivered atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { delivered.Add(1) }))
	defer srv.Close()
	cs := newCounters()
	d := &events.Deliverer{Source: cur, URL: func(string) string { return srv.URL }, Secret: func() []byte { return secret }, Poll: time.Millisecond, Counters: cs}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	waitFor(t, "the first three", func() bool { return delivered.Load() == 3 })
	cancel()
	<-done
	add(12) // seq 4..15: the ring keeps 11..15, so 4..10 are dropped
	ctx, cancel = context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	waitFor(t, "the five kept", func() bool { return delivered.Load() == 8 })
	cancel()
	<-done
	if cs.dropped != 7 {
		t.Fatalf("dropped %d, want 7", cs.dropped)
	}
}

// A receiver that hangs delays only its own events: a healthy receiver
// beside it gets every one of its events while the first still holds its
// first call.
func TestDeliverHangingBesideHealthy(t *testing.T) {
	s := memstore.New()
	ev, _ := events.Of(s)
	if err := ev.SetEventRules(map[string]events.Rule{"slow": {Thresholds: []float64{0.5, 1}}, "fast": {Thresholds: []float64{0.5, 1}}}); err != nil {
		t.Fatal(err)
	}
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-release
	}))
	defer hanging.Close()
	defer close(release)
	rc := &receiver{t: t, got: map[string]events.Event{}, fail: func(int64) bool { return false }}
	healthy := httptest.NewServer(rc)
	defer healthy.Close()
	d := &events.Deliverer{
		Source: &events.Cursor{Store: ev},
		URL: func(rule string) string {
			if rule == "slow" {
				return hanging.URL
			}
			return healthy.URL
		},
		Secret: func() []byte { return secret }, Timeout: time.Hour, Poll: time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	drive(t, s, "slow", 50) // first in the store: the hanging receiver takes one and holds it
	<-arrived
	want := drive(t, s, "fast", 50)
	waitFor(t, "every event of the healthy receiver", func() bool { return rc.count() >= want })
	if n := rc.count(); n != want {
		t.Fatalf("healthy receiver got %d events, want %d", n, want)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, e := range rc.got {
		if e.Rule != "fast" {
			t.Fatalf("healthy receiver got %+v", e)
		}
	}
}
