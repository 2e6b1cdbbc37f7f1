package server

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

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
