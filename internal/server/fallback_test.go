package server

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/storetest"
)

// downStore fails every call as a dead Redis does, or with weir.ErrNotSent
// as a decision queued past its deadline does.
type downStore struct{ notSent bool }

func (d downStore) err() error {
	if d.notSent {
		return fmt.Errorf("%w: waited past its deadline for a connection", weir.ErrNotSent)
	}
	return fmt.Errorf("%w: dial tcp 127.0.0.1:1: connection refused", weir.ErrStore)
}

func (d downStore) Take(context.Context, string, weir.Limit, int64) (weir.Result, error) {
	return weir.Result{}, d.err()
}
func (d downStore) Do(context.Context, []weir.Request, []weir.Result) error { return d.err() }

// withClock makes the server, its guard and the local fallback read now.
func withClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// TestFallbackSameOnEveryPath: one outage, seen through Check (/v1/auth),
// CheckKey (/v1/check) and the Envoy decider (gRPC), gives one answer for
// each on_error mode: Allowed, Limit, Remaining, RetryAfter (the rest of
// the breaker's cooldown) and ResetAfter, the local limit divided the one
// way; and a request the local share can never admit is refused alike.
func TestFallbackSameOnEveryPath(t *testing.T) {
	for _, mode := range []string{config.OnErrorAllow, config.OnErrorDeny, config.OnErrorLocal} {
		t.Run(mode, func(t *testing.T) {
			clk := storetest.NewClock(storetest.Epoch)
			cfg := mustParse(t, `
store: {on_error: `+mode+`, breaker: {failures: 1, cooldown: 30s}}
instances: 3
rules:
  - {name: r, identity: header:X-Key, limit: 7/m, algorithm: fixed_window}
`)
			s, _ := newTestServer(t, WithConfig(cfg), WithStore(downStore{}), withClock(clk.Now))
			p := s.Policy()
			p.CheckKey(ctx(), policy.KeyRequest{Rule: "r", Key: "opener", N: 1}) // opens the breaker
			clk.Advance(4 * time.Second)                                         // 26s of cooldown left
			limit, _ := p.Limit("r", "")
			envoy := func(key string, n int64) (weir.Result, string) {
				t.Helper()
				var res [1]weir.Result
				var fb [1]string
				if err := s.envoyDecider(ctx(), []weir.Request{{Key: key, Limit: limit, N: n}}, res[:], fb[:]); err != nil {
					t.Fatalf("envoy decider: %v", err)
				}
				return res[0], fb[0]
			}
			for i := range 4 {
				r := httptest.NewRequest("GET", "/", nil)
				r.Header.Set("X-Key", "a")
				v := p.Check(ctx(), r)
				ck, err := p.CheckKey(ctx(), policy.KeyRequest{Rule: "r", Key: "b", N: 1})
				if err != nil {
					t.Fatal(err)
				}
				ev, efb := envoy("envoy-c", 1)
				chk := v.Results[0]
				if chk.Fallback != mode || ck.Fallback != mode || efb != mode {
					t.Fatalf("request %d: fallbacks %q %q %q, want %q", i, chk.Fallback, ck.Fallback, efb, mode)
				}
				if chk.Result != ck.Result || ck.Result != ev {
					t.Fatalf("request %d: Check %+v\nCheckKey %+v\nEnvoy %+v\nthey differ", i, chk.Result, ck.Result, ev)
				}
				switch mode {
				case config.OnErrorAllow:
					if !ev.Allowed || ev.Limit != 7 || ev.Remaining != 7 {
						t.Fatalf("allow: %+v", ev)
					}
				case config.OnErrorDeny:
					if ev.Allowed || ev.RetryAfter != 26*time.Second || ev.ResetAfter != 26*time.Second {
						t.Fatalf("deny: %+v, want a retry after the 26s of cooldown left", ev)
					}
				case config.OnErrorLocal:
					if ev.Limit != 3 || ev.Allowed != (i < 3) {
						t.Fatalf("local, request %d: %+v, want 7/m over 3 instances = 3", i, ev)
					}
				}
			}
			if mode != config.OnErrorLocal {
				return
			}
			// 3 hits fit the whole limit (7) but never the local share (3 is
			// fine, 4 is not).
			ck, err := p.CheckKey(ctx(), policy.KeyRequest{Rule: "r", Key: "big", N: 4})
			if err != nil {
				t.Fatal(err)
			}
			ev, _ := envoy("envoy-big", 4)
			want := weir.Result{Limit: 3, RetryAfter: 26 * time.Second, ResetAfter: 26 * time.Second}
			if ck.Result != want || ev != want {
				t.Fatalf("beyond the local share: CheckKey %+v, Envoy %+v, want %+v", ck.Result, ev, want)
			}
		})
	}
}

func ctx() context.Context { return context.Background() }

// TestNotSentIsNoStoreError: a decision never sent to the store
// (weir.ErrNotSent) falls back but is no store error, on /v1/check and on
// the Envoy path alike.
func TestNotSentIsNoStoreError(t *testing.T) {
	cfg := mustParse(t, "store: {on_error: allow}\nrules:\n  - {name: r, limit: 7/m}\n")
	s, ts := newTestServer(t, WithConfig(cfg), WithStore(downStore{notSent: true}))
	for range 3 {
		if code, d := check(t, ts.URL, "r", "k", 1); code != 200 || d["allowed"] != true || d["fallback"] != "allow" {
			t.Fatalf("%d %v", code, d)
		}
	}
	limit, _ := s.Policy().Limit("r", "")
	reqs := make([]weir.Request, 3)
	for i := range reqs {
		reqs[i] = weir.Request{Key: fmt.Sprint("envoy-", i), Limit: limit, N: 1}
	}
	res, fb := make([]weir.Result, 3), make([]string, 3)
	if err := s.envoyDecider(ctx(), reqs, res, fb); err != nil || !res[2].Allowed || fb[2] != "allow" {
		t.Fatalf("envoy: %v %+v %q", err, res, fb)
	}
	_, b := call(t, "GET", ts.URL+"/metrics", "")
	m := string(b)
	if !strings.Contains(m, "weir_store_errors_total 0") || s.metrics.errorsTotal.Load() != 0 {
		t.Fatalf("decisions never sent counted as store errors:\n%s", grepLines(m, "weir_store_errors"))
	}
	if !strings.Contains(m, `weir_fallback_decisions_total{fallback="allow",result="allowed",rule="r"} 3`) {
		t.Fatalf("fallback decisions:\n%s", grepLines(m, "weir_"))
	}
	if s.guard.State() != guard.BreakerClosed {
		t.Fatalf("breaker %v after decisions never sent", s.guard.State())
	}
}

// gateStore holds every call that takes until released and records how many were
// under way at once.
type gateStore struct {
	mu       sync.Mutex
	inflight int
	max      int
	gate     chan struct{}
}

func (g *gateStore) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if n == 0 {
		return weir.Result{Allowed: true, Limit: l.Rate, Remaining: l.Rate}, nil // the readiness probe's peek
	}
	g.mu.Lock()
	g.inflight++
	g.max = max(g.max, g.inflight)
	g.mu.Unlock()
	<-g.gate
	g.mu.Lock()
	g.inflight--
	g.mu.Unlock()
	return weir.Result{Allowed: true, Limit: l.Rate, Remaining: l.Rate - n, Granted: n}, nil
}

func (g *gateStore) Do(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
	for i, r := range reqs {
		if r.Mode == weir.ModeReset || r.Mode == weir.ModeRelease {
			continue
		}
		var err error
		if res[i], err = g.Take(ctx, r.Key, r.Limit, r.N); err != nil {
			return err
		}
	}
	return nil
}

func (g *gateStore) now() (inflight, max int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inflight, g.max
}

// TestEnvoyDeciderBounded: one Envoy call's descriptors are decided at
// most maxEnvoyInFlight at a time, whatever their number.
func TestEnvoyDeciderBounded(t *testing.T) {
	store := &gateStore{gate: make(chan struct{})}
	cfg := mustParse(t, "store: {timeout: 1m}\nrules: []\n")
	s, _ := newTestServer(t, WithConfig(cfg), WithStore(store))
	const n = 40
	reqs := make([]weir.Request, n)
	for i := range reqs {
		reqs[i] = weir.Request{Key: fmt.Sprint("d", i), Limit: weir.PerMinute(weir.FixedWindow, 100), N: 1}
	}
	res, fb := make([]weir.Result, n), make([]string, n)
	done := make(chan error, 1)
	go func() { done <- s.envoyDecider(ctx(), reqs, res, fb) }()
	eventually(t, 30*time.Second, "the first decisions to reach the store", func() bool {
		in, _ := store.now()
		return in >= maxEnvoyInFlight
	})
	// Give any unbounded fan-out time to show; this waits, it asserts no time.
	time.Sleep(100 * time.Millisecond)
	if _, m := store.now(); m != maxEnvoyInFlight {
		t.Fatalf("%d store calls under way at once for one call of %d descriptors, want at most %d", m, n, maxEnvoyInFlight)
	}
	close(store.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !r.Allowed || r.Granted != 1 || fb[i] != "" {
			t.Fatalf("descriptor %d: %+v %q", i, r, fb[i])
		}
	}
	if _, m := store.now(); m > maxEnvoyInFlight {
		t.Fatalf("%d under way at once", m)
	}
}
