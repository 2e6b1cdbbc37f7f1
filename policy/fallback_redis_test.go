package policy

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
)

// TestRedisInvalidProbeKeepsBreakerOpen: with Redis stopped, a CheckKey
// with hits over the limit (which redisstore refuses before sending) is a
// client error, and as the half-open probe it leaves the breaker as it was;
// the next valid call probes the dead Redis and opens it again. Once Redis
// is back, a valid probe closes it. The breaker runs on the injected clock;
// the store's timeout is not under test (a stopped Redis refuses at once),
// so it is generous, and Redis's return is awaited on a deadline, not a
// count of tries.
func TestRedisInvalidProbeKeepsBreakerOpen(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := newClock()
	p := mustPolicy(t, "store: {timeout: 5s, breaker: {failures: 1, cooldown: 5s}}\nrules:\n  - {name: r, limit: 3/m}\n",
		redisStore(t, []string{srv.Addr}, 5*time.Second), WithClock(clock.Now), WithLogger(slog.New(&countingHandler{})))
	if rr, err := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 1}); err != nil || rr.Err != nil {
		t.Fatalf("Redis up: %+v %v", rr, err)
	}
	srv.Stop()
	if rr, err := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 1}); err != nil || rr.Err == nil || rr.Fallback != config.OnErrorLocal || p.Guard().State() != guard.BreakerOpen {
		t.Fatalf("Redis down: %+v %v, breaker %v", rr, err, p.Guard().State())
	}
	clock.Advance(5 * time.Second)
	if _, err := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 4}); !errors.Is(err, weir.ErrInvalidCost) {
		t.Fatalf("hits over the limit: %v, want ErrInvalidCost", err)
	}
	if s := p.Guard().State(); s != guard.BreakerHalfOpen {
		t.Fatalf("after an invalid request as the probe: breaker %v, want half_open", s)
	}
	if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 1}); rr.Err == nil || p.Guard().State() != guard.BreakerOpen {
		t.Fatalf("the valid probe over a dead Redis: %+v, breaker %v; want an error and open", rr, p.Guard().State())
	}
	srv.Start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		clock.Advance(5 * time.Second)
		rr, err := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 1})
		if err == nil && rr.Err == nil && p.Guard().State() == guard.BreakerClosed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis back for 30s: %+v %v, breaker %v", rr, err, p.Guard().State())
		}
		time.Sleep(50 * time.Millisecond) // the client reconnects
	}
}
