package policy

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/redisstore"
)

func redisStore(t *testing.T, addrs []string, timeout time.Duration) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(context.Background(), redisstore.Config{Addrs: addrs, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

const multiRules = `
store: {timeout: 5s}
rules:
  - {name: per-ip, identity: ip, limit: 10/h, algorithm: sliding_window}
  - {name: per-user, identity: header:X-User, limit: 3/h, algorithm: fixed_window}
  - {name: global, identity: const:all, limit: 1000/h, algorithm: token_bucket}
  - {name: log, identity: ip, limit: 20/h, algorithm: sliding_log}
`

// checkAllOrNothing exhausts the per-user rule and checks that the
// rejections consumed nothing from the other rules.
func checkAllOrNothing(t *testing.T, p *Policy) {
	for i := 0; i < 3; i++ {
		v := p.Check(ctx, req("GET", "/", "X-User", "u1"))
		if !v.Allowed {
			t.Fatalf("request %d: %+v", i+1, v)
		}
		for _, rr := range v.Results {
			if rr.Err != nil {
				t.Fatalf("store error: %v", rr.Err)
			}
		}
	}
	for i := 0; i < 5; i++ {
		v := p.Check(ctx, req("GET", "/", "X-User", "u1"))
		if rr, _ := v.Limited(); v.Allowed || rr.Rule != "per-user" || rr.Err != nil {
			t.Fatalf("rejection %d: %+v", i+1, v)
		}
	}
	for _, c := range []struct {
		rule, key string
		want      int64
	}{{"per-ip", "192.0.2.1", 7}, {"global", "all", 997}, {"log", "192.0.2.1", 17}, {"per-user", "u1", 0}} {
		rr, err := p.CheckKey(ctx, KeyRequest{Rule: c.rule, Key: c.key, N: 0})
		if err != nil || rr.Err != nil || rr.Result.Remaining != c.want {
			t.Errorf("%s: remaining %d, want %d (%v %v)", c.rule, rr.Result.Remaining, c.want, err, rr.Err)
		}
	}
}

// TestRedisAllOrNothing: on one Redis the batch is one atomic script.
func TestRedisAllOrNothing(t *testing.T) {
	srv := redistest.Standalone(t)
	p := mustPolicy(t, multiRules, redisStore(t, []string{srv.Addr}, 5*time.Second))
	checkAllOrNothing(t, p)
}

// TestRedisClusterAllOrNothing: on a cluster the rules' keys live in
// different slots; the slots that admitted are refunded.
func TestRedisClusterAllOrNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.Cluster(t)
	p := mustPolicy(t, multiRules, redisStore(t, c.Addrs, 5*time.Second))
	checkAllOrNothing(t, p)
}

// TestRedisOutage kills redis-server mid-run: the breaker opens, the local
// fallback decides, and when the server is back the store decides again
// without any intervention.
func TestRedisOutage(t *testing.T) {
	srv := redistest.Standalone(t)
	// Generous timeouts: a killed Redis refuses at once, and a loaded
	// machine must not turn a slow call before the outage into a fallback.
	store := redisStore(t, []string{srv.Addr}, 5*time.Second)
	var states []string
	stateCh := make(chan string, 16)
	g := guard.New(store, guard.Config{
		Timeout: 5 * time.Second,
		Breaker: guard.BreakerConfig{Failures: 3, Cooldown: 100 * time.Millisecond},
		Logger:  slog.New(&countingHandler{}),
		OnStateChange: func(_, to guard.BreakerState) {
			select {
			case stateCh <- to.String():
			default:
			}
		},
	})
	p := mustPolicy(t, `
instances: 2
rules:
  - {name: api, identity: header:X-User, limit: 10/h, algorithm: fixed_window, on_error: local}
  - {name: open, identity: header:X-User, limit: 1000/h, on_error: allow}
`, g)
	check := func(user string) Verdict { return p.Check(ctx, req("GET", "/", "X-User", user)) }

	for i := 0; i < 4; i++ {
		v := check("u1")
		if !v.Allowed || v.Results[0].Err != nil || v.Results[0].Result.Remaining != int64(9-i) {
			t.Fatalf("before the outage: %+v", v.Results[0])
		}
	}

	srv.Kill()
	// Each request falls back; after 3 failures the breaker opens.
	for i := 0; i < 3; i++ {
		v := check("u2")
		if !v.Allowed || v.Results[0].Fallback != "local" || v.Results[1].Fallback != "allow" || v.Results[0].Err == nil {
			t.Fatalf("during the outage, request %d: %+v", i+1, v.Results)
		}
	}
	if g.State() != guard.BreakerOpen {
		t.Fatalf("breaker %v after 3 failures", g.State())
	}
	// While open, calls fail fast without touching Redis; the local
	// limiter enforces 10/h over 2 instances = 5, of which 3 are used.
	admitted := 0
	for i := 0; i < 5; i++ {
		v := check("u2")
		rr := v.Results[0]
		if rr.Fallback != "local" || rr.Result.Limit != 5 {
			t.Fatalf("fallback: %+v", rr)
		}
		if !errors.Is(rr.Err, guard.ErrCircuitOpen) && !errors.Is(rr.Err, context.DeadlineExceeded) {
			// A half-open probe may have reached the dead server; otherwise
			// the breaker answered.
			t.Logf("request %d: %v", i, rr.Err)
		}
		if v.Allowed {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("local fallback admitted %d more, want 2", admitted)
	}

	srv.Start()
	// Recovery is automatic: a probe after the cooldown finds Redis back.
	var v Verdict
	waitFor(t, 30*time.Second, "the store to decide again", func() bool {
		v = check("u1")
		return v.Results[0].Fallback == "" && v.Results[0].Err == nil
	})
	if g.State() != guard.BreakerClosed {
		t.Fatalf("breaker %v after recovery", g.State())
	}
	// The server restarted empty (no persistence): u1 starts over.
	if v.Results[0].Result.Remaining != 9 {
		t.Fatalf("after recovery: %+v", v.Results[0].Result)
	}
	for len(stateCh) > 0 {
		states = append(states, <-stateCh)
	}
	if len(states) < 3 || states[0] != "open" || states[len(states)-1] != "closed" {
		t.Fatalf("breaker transitions %v", states)
	}
}
