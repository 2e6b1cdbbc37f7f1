package protect

import (
	"errors"
	"testing"
	"time"
)

// call runs one call of latency rtt through r on clock c.
func call(t *testing.T, r *Rule, c *fakeClock, rtt time.Duration, failed bool) error {
	t.Helper()
	tk, err := r.Acquire(Normal)
	if err != nil {
		return err
	}
	c.Advance(rtt)
	tk.Done(failed)
	return nil
}

func mustRule(t *testing.T, cfg Config) *Rule {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func state(r *Rule) State { return r.Stats().State }

// TestBreakerStrategies drives each strategy to its documented threshold:
// one outcome short of it the breaker stays closed, at it the breaker
// opens; it refuses calls for open_for, lets one probe through, and a
// good probe closes it (a bad one opens it again).
func TestBreakerStrategies(t *testing.T) {
	const ms = time.Millisecond
	cases := []struct {
		name string
		cfg  BreakerConfig
		// bad makes the i-th call count against the breaker.
		good, bad func(t *testing.T, r *Rule, c *fakeClock)
		short     int // bad calls among 20 that must not trip it
	}{
		{
			name: "slow_ratio",
			cfg:  BreakerConfig{SlowCall: 500 * ms, SlowRatio: 0.5, MinRequests: 20, Window: 10 * time.Second, OpenFor: 10 * time.Second},
			good: func(t *testing.T, r *Rule, c *fakeClock) { _ = call(t, r, c, 500*ms, false) }, // at slow_call: not slow
			bad:  func(t *testing.T, r *Rule, c *fakeClock) { _ = call(t, r, c, 501*ms, false) },
		},
		{
			name: "error_ratio",
			cfg:  BreakerConfig{ErrorRatio: 0.5, MinRequests: 20, Window: 10 * time.Second, OpenFor: 10 * time.Second},
			good: func(t *testing.T, r *Rule, c *fakeClock) { _ = call(t, r, c, ms, false) },
			bad:  func(t *testing.T, r *Rule, c *fakeClock) { _ = call(t, r, c, ms, true) },
		},
		{
			name: "errors",
			cfg:  BreakerConfig{Errors: 10, MinRequests: 20, Window: 10 * time.Second, OpenFor: 10 * time.Second},
			good: func(t *testing.T, r *Rule, c *fakeClock) { _ = call(t, r, c, ms, false) },
			bad:  func(t *testing.T, r *Rule, c *fakeClock) { _ = call(t, r, c, ms, true) },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			cfg := tc.cfg
			r := mustRule(t, Config{Name: "dep", Breaker: &cfg, Now: c.Now})
			// 19 calls, all bad: under min_requests, still closed.
			for range 19 {
				tc.bad(t, r, c)
			}
			if s := state(r); s != Closed {
				t.Fatalf("after 19 bad calls (min_requests 20): %v, want closed", s)
			}
			// A fresh window: 11 good then 9 bad is 9/20, short of 10.
			c.Advance(cfg.Window)
			for range 11 {
				tc.good(t, r, c)
			}
			for range 9 {
				tc.bad(t, r, c)
			}
			if s := state(r); s != Closed {
				t.Fatalf("after 9 bad of 20: %v, want closed", s)
			}
			tc.bad(t, r, c) // 10 bad of 21 (ratio 0.476) or 10 errors
			if tc.name == "errors" {
				if s := state(r); s != Open {
					t.Fatalf("after 10 errors: %v, want open", s)
				}
			} else {
				if s := state(r); s != Closed {
					t.Fatalf("after 10 bad of 21: %v, want closed", s)
				}
				tc.bad(t, r, c) // 11 of 22: 0.5
				if s := state(r); s != Open {
					t.Fatalf("after 11 bad of 22: %v, want open", s)
				}
			}
			openedAt := c.Now()
			err := call(t, r, c, ms, false)
			var rej *Rejection
			if !errors.As(err, &rej) || rej.Reason != ReasonCircuitOpen || !errors.Is(err, ErrCircuitOpen) {
				t.Fatalf("call while open: %v, want a circuit_open rejection", err)
			}
			if want := cfg.OpenFor - c.Now().Sub(openedAt); rej.RetryAfter != want {
				t.Errorf("RetryAfter %v, want %v", rej.RetryAfter, want)
			}
			c.Advance(openedAt.Add(cfg.OpenFor).Sub(c.Now()) - time.Nanosecond)
			if err := call(t, r, c, 0, false); err == nil {
				t.Fatal("a call a nanosecond before open_for ends passed")
			}
			c.Advance(time.Nanosecond)
			// Half-open: one probe passes, a second call meanwhile does not.
			probe, err := r.Acquire(Normal)
			if err != nil {
				t.Fatalf("probe refused after open_for: %v", err)
			}
			if s := state(r); s != HalfOpen {
				t.Fatalf("during the probe: %v, want half_open", s)
			}
			if _, err := r.Acquire(Critical); !errors.Is(err, ErrCircuitOpen) {
				t.Fatalf("second call while half-open: %v, want circuit_open", err)
			}
			// A bad probe opens it again.
			if tc.name == "slow_ratio" {
				c.Advance(501 * ms)
				probe.Done(false)
			} else {
				probe.Done(true)
			}
			if s := state(r); s != Open {
				t.Fatalf("after a bad probe: %v, want open", s)
			}
			c.Advance(cfg.OpenFor)
			tc.good(t, r, c)
			if s := state(r); s != Closed {
				t.Fatalf("after a good probe: %v, want closed", s)
			}
			st := r.Stats()
			if st.Transitions != [NumStates]uint64{Closed: 1, Open: 2, HalfOpen: 2} {
				t.Errorf("transitions %v, want closed 1, open 2, half_open 2", st.Transitions)
			}
			if st.CircuitOpen != 3 {
				t.Errorf("CircuitOpen %d, want 3", st.CircuitOpen)
			}
			// Closing forgot the old window: 19 bad calls do not trip it.
			for range 19 {
				tc.bad(t, r, c)
			}
			if tc.name != "errors" {
				if s := state(r); s != Closed {
					t.Fatalf("after closing and 19 bad calls: %v, want closed", s)
				}
			}
		})
	}
}

// TestBreakerWindowSlides: outcomes older than the window no longer count.
func TestBreakerWindowSlides(t *testing.T) {
	c := newClock()
	r := mustRule(t, Config{Name: "dep", Now: c.Now, Breaker: &BreakerConfig{Errors: 5, MinRequests: 1, Window: 10 * time.Second}})
	for range 4 {
		_ = call(t, r, c, 0, true)
	}
	c.Advance(10 * time.Second)
	_ = call(t, r, c, 0, true)
	if s := state(r); s != Closed {
		t.Fatalf("4 errors a window ago and 1 now: %v, want closed", s)
	}
	for range 4 {
		_ = call(t, r, c, 0, true)
	}
	if s := state(r); s != Open {
		t.Fatalf("5 errors within the window: %v, want open", s)
	}
}

// TestBreakerProbes: with probes: 3 the breaker lets three calls through
// half-open and closes only when all three succeed; a cancelled probe is
// given back.
func TestBreakerProbes(t *testing.T) {
	c := newClock()
	r := mustRule(t, Config{Name: "dep", Now: c.Now, Breaker: &BreakerConfig{Errors: 1, MinRequests: 1, OpenFor: time.Second, Probes: 3}})
	_ = call(t, r, c, 0, true)
	c.Advance(time.Second)
	var tks []Ticket
	for i := range 3 {
		tk, err := r.Acquire(Normal)
		if err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
		tks = append(tks, tk)
	}
	if _, err := r.Acquire(Normal); err == nil {
		t.Fatal("a fourth call passed a half-open breaker with probes: 3")
	}
	tks[2].Cancel()
	tk, err := r.Acquire(Normal)
	if err != nil {
		t.Fatalf("after a probe was cancelled: %v", err)
	}
	tks[2] = tk
	for i := range tks {
		tks[i].Done(false)
		if want := map[bool]State{true: Closed, false: HalfOpen}[i == 2]; state(r) != want {
			t.Fatalf("after %d good probes: %v, want %v", i+1, state(r), want)
		}
	}
}
