package server

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/storetest"
)

// msgCounter counts slog records by message.
type msgCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *msgCounter) Enabled(context.Context, slog.Level) bool { return true }

func (h *msgCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.n[r.Message]++
	h.mu.Unlock()
	return nil
}

func (h *msgCounter) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *msgCounter) WithGroup(string) slog.Handler { return h }

func (h *msgCounter) counts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.n))
	for k, v := range h.n {
		out[k] = v
	}
	return out
}

// TestStoreOutageLoggedByTheGuardAlone: ten minutes of a dead store, a
// failed half-open probe a second, log the guard's outage lines (one at
// the start, one a minute) and nothing per breaker transition: the server
// used to add a WARN line for each, two a second.
func TestStoreOutageLoggedByTheGuardAlone(t *testing.T) {
	clk := storetest.NewClock(storetest.Epoch)
	cfg := mustParse(t, `
store: {on_error: local, breaker: {failures: 1, cooldown: 1s}}
rules:
  - {name: r, identity: header:X-Key, limit: 7/m}
`)
	h := &msgCounter{n: map[string]int{}}
	s, _ := newTestServer(t, WithConfig(cfg), WithStore(downStore{}), withClock(clk.Now), WithLogger(slog.New(h)))
	p := s.Policy()
	const outage = 10 * time.Minute
	for start := clk.Now(); clk.Now().Sub(start) <= outage; clk.Advance(time.Second) {
		for range 3 { // the probe, then two calls the open breaker refuses
			if _, err := p.CheckKey(ctx(), policy.KeyRequest{Rule: "r", Key: "someone", N: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := h.counts()
	if n := got["weir: store outage started; rules fall back to their on_error policy"]; n != 1 {
		t.Errorf("%d outage-started lines, want 1: %v", n, got)
	}
	if n, want := got["weir: store still down"], int(outage/time.Minute); n != want {
		t.Errorf("%d still-down lines, want %d: %v", n, want, got)
	}
	if n := got["weir: store circuit breaker changed state"]; n != 0 {
		t.Errorf("%d lines for breaker transitions in a %v outage, want none: %v", n, outage, got)
	}
	// docs/operations.md promises about two dozen lines for a ten-minute
	// outage, the background tasks' included (none run here: no Redis).
	total := 0
	for _, n := range got {
		total += n
	}
	if total > 24 {
		t.Errorf("a %v outage logged %d lines; docs/operations.md promises about two dozen: %v", outage, total, got)
	}
	t.Logf("%d lines: %v", total, got)
}

// TestGRPCOffInConfig: server.grpc: off serves no gRPC; --grpc (WithGRPCAddr)
// still wins over it.
func TestGRPCOffInConfig(t *testing.T) {
	cfg := mustParse(t, "server: {grpc: off}\nrules:\n  - {name: r, limit: 7/m}\n")
	s, _ := newTestServer(t, WithConfig(cfg))
	if a := s.GRPCAddr(); a != "" {
		t.Fatalf("grpc: off: GRPCAddr %q, want none", a)
	}
	s, _ = newTestServer(t, WithConfig(cfg), WithGRPCAddr("127.0.0.1:0"))
	if a := s.GRPCAddr(); a != "127.0.0.1:0" {
		t.Fatalf("grpc: off and --grpc 127.0.0.1:0: GRPCAddr %q", a)
	}
}

// recordLog keeps every slog record: its level, message and attributes.
type recordLog struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordLog) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}

func (h *recordLog) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *recordLog) WithGroup(string) slog.Handler { return h }

func (h *recordLog) records() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), h.recs...)
}

// TestRealRedisOutageLogsEachTaskTwice: a real redis-server stopped for 40
// s under traffic, with the background loops (fleet counters, rule
// polling) running ten times a second, the penalty-box index writing and
// the deny cache resubscribing, logs each task's failure once, and its
// recovery once with the count of failures it did not log; no line twice.
// The loops used to log a failure every 10 or 30 s each: a ten-minute
// outage was about 120 lines.
func TestRealRedisOutageLogsEachTaskTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("a 40 s outage; skipped in -short mode")
	}
	r := redistest.Standalone(t)
	cfg := mustParse(t, `
store: {timeout: 200ms, on_error: local}
rules:
  - {name: login, identity: header:X-Key, limit: 1/m, block: 10m}
`)
	h := &recordLog{}
	s, _ := newTestServer(t, WithConfig(cfg), WithRedisURL("redis://"+r.Addr), WithLogger(slog.New(h)), withFastLoops())
	p := s.Policy()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // traffic that keeps landing in the penalty box
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			key := "k" + strconv.Itoa(i%50)
			_, _ = p.CheckKey(ctx(), policy.KeyRequest{Rule: "login", Key: key, N: 1})
		}
	}()
	defer func() { close(stop); <-done }()
	time.Sleep(time.Second)
	before := len(h.records())

	r.Stop()
	time.Sleep(40 * time.Second)
	r.Start()

	tasks := map[string]string{
		"weir: exchanging fleet counters through Redis failed; the dashboard shows this instance only": "weir: exchanging fleet counters through Redis works again",
		"weir: polling Redis for rule changes failed":                                                  "weir: polling Redis for rule changes works again",
		"penalty-box index: writing to Redis failed; the fleet list may miss entries":                  "penalty-box index: writing to Redis works again",
		"weir: deny cache: subscribing to its invalidation channel failed; retrying quietly":           "weir: deny cache: subscribed to its invalidation channel again",
	}
	var during []slog.Record
	deadline := time.Now().Add(30 * time.Second)
	for {
		during = h.records()[before:]
		back := 0
		for _, rec := range during {
			for _, b := range tasks {
				if rec.Message == b {
					back++
				}
			}
		}
		if back == len(tasks) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s, %d of %d tasks logged their recovery: %v", back, len(tasks), messages(during))
		}
		time.Sleep(100 * time.Millisecond)
	}
	count := map[string]int{}
	for _, rec := range during {
		count[rec.Message]++
		if b, ok := attrOf(rec, "failures_not_logged"); ok && b.Int64() < 10 {
			t.Errorf("%q: %d failures not logged in a 40 s outage at 10 runs a second: the count is wrong", rec.Message, b.Int64())
		}
	}
	for warn, back := range tasks {
		if count[warn] != 1 || count[back] != 1 {
			t.Errorf("%q logged %d times and %q %d times, want once each", warn, count[warn], back, count[back])
		}
	}
	for msg, n := range count {
		if n > 1 {
			t.Errorf("%q logged %d times in one outage", msg, n)
		}
	}
	// The breaker's start and end, a line for its first failure, each
	// task's two, and the deny cache's bypass: 16 at most, for any length
	// of outage under the breaker's minute between "still down" lines.
	if len(during) > 16 {
		t.Errorf("a 40 s outage logged %d lines: %v", len(during), messages(during))
	}
	t.Logf("%d lines: %v", len(during), messages(during))
}

func messages(recs []slog.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Level.String()+" "+r.Message)
	}
	return out
}

func attrOf(r slog.Record, key string) (slog.Value, bool) {
	var v slog.Value
	found := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v, found = a.Value, true
			return false
		}
		return true
	})
	return v, found
}
