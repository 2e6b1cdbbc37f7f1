package policy

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/guard"
)

// TestLeaseConfig: lease is checked against the algorithm table, block and
// the rate, each problem at its line and column.
func TestLeaseConfig(t *testing.T) {
	for _, c := range []struct{ rule, want string }{
		{"{name: a, limit: 10/s, lease: 5}", "lease 5: a lease applies only to fixed_window and sliding_window, not gcra"},
		{"{name: a, limit: 10/s, algorithm: token_bucket, lease: 5}", "not token_bucket"},
		{"{name: a, limit: 10/s, algorithm: fixed_window, block: 1m, lease: 5}", "lease 5 and block 1m0s do not combine"},
		{"{name: a, limit: 10/s, algorithm: fixed_window, lease: 11}", "lease 11 is over the limit's rate 10"},
		{"{name: a, limit: 10/s, algorithm: fixed_window, lease: -1}", "lease must be at least 1, got -1"},
		{"{name: a, limit: 10/s, algorithm: fixed_window, lease: lots}", "lease"},
	} {
		doc := "rules:\n  - " + c.rule + "\n"
		_, err := Parse([]byte(doc), "lease.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.rule, err, c.want)
			continue
		}
		col := strings.Index(c.rule, "lease:") + 5 // the value's column: "  - " is 4 columns
		if c.want != "lease" && !strings.HasPrefix(err.Error(), "lease.yaml:2:"+itoa(col+7)+": ") {
			t.Errorf("%s: %v, want it at 2:%d", c.rule, err, col+7)
		}
	}
	tiers := `
rules:
  - name: a
    lease: 50
    tiers:
      by: header:X-Plan
      default: {limit: 100/m, algorithm: fixed_window}
      small: {limit: 20/m, algorithm: fixed_window}
`
	if _, err := Parse([]byte(tiers), "t.yaml"); err == nil || !strings.Contains(err.Error(), `t.yaml:4:12: lease 50 is over the limit's rate 20 of tier "small"`) {
		t.Errorf("tiers: %v", err)
	}
	p := mustPolicy(t, "rules:\n  - {name: a, limit: 100/m, algorithm: sliding_window, lease: 10}\n", nil)
	if p.Rules()[0].LocalBudget != 10 {
		t.Errorf("RuleInfo.LocalBudget = %d", p.Rules()[0].LocalBudget)
	}
}

// TestLocalBudgetKey: local_budget is the key; lease, its former name,
// still works, and a rule giving both is told to keep local_budget.
// Messages name the key as written.
func TestLocalBudgetKey(t *testing.T) {
	p := mustPolicy(t, "rules:\n  - {name: a, limit: 100/m, algorithm: fixed_window, local_budget: 10}\n", nil)
	if p.Rules()[0].LocalBudget != 10 {
		t.Errorf("RuleInfo.LocalBudget = %d, want 10", p.Rules()[0].LocalBudget)
	}
	for _, c := range []struct{ rule, want string }{
		{"{name: a, limit: 10/s, local_budget: 5}", "lease.yaml:2:42: local_budget 5: a local budget applies only to fixed_window and sliding_window, not gcra"},
		{"{name: a, limit: 10/s, algorithm: fixed_window, local_budget: 11}", "local_budget 11 is over the limit's rate 10; a local budget takes part of the limit"},
		{"{name: a, limit: 10/s, algorithm: fixed_window, local_budget: 5, lease: 5}", "lease is the former name of local_budget; give local_budget alone"},
		{"{name: a, limit: 10/s, algorithm: fixed_window, lease: 5, local_budget: 5}", "lease is the former name of local_budget"},
	} {
		_, err := Parse([]byte("rules:\n  - "+c.rule+"\n"), "lease.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.rule, err, c.want)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestLeaseCheck: a leased rule admits exactly its limit through Check
// and CheckKey with one store call per lease; beside another rule that
// refuses, its units go back to the lease, so a flood refused by a
// per-client rule does not drain a global leased budget.
func TestLeaseCheck(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	p := mustPolicy(t, `
rules:
  - {name: global, identity: const:all, limit: 100/m, algorithm: fixed_window, lease: 10}
  - {name: per-ip, limit: 5/m, algorithm: fixed_window}
`, store, WithClock(clock.Now))
	admitted := 0
	for i := range 300 {
		ip := "192.0.2." + itoa(i%60+1) + ":1"
		if v := p.Check(ctx, from(req("GET", "/"), ip)); v.Allowed {
			admitted++
		}
	}
	// 60 clients × 5 = 300 would pass per-ip; global admits exactly 100,
	// as the per-ip refusals (none here before the global runs out) give
	// their units back.
	if admitted != 100 {
		t.Errorf("admitted %d, want 100", admitted)
	}
	// One client over its own limit: its requests are refused by per-ip,
	// and the global budget they were admitted from comes back.
	clock.Advance(time.Minute)
	for range 50 {
		p.Check(ctx, from(req("GET", "/"), "198.51.100.7:1"))
	}
	s := p.LocalBudgets().Stats()
	if got := s.Spent; got != 105 {
		t.Errorf("spent %d after one client's 50 requests, want 100 + its 5 admitted", got)
	}
	// CheckKey spends from the same lease; Reset forgets it.
	rr, err := p.CheckKey(ctx, KeyRequest{Rule: "global", Key: "all", N: 3})
	if err != nil || !rr.Result.Allowed {
		t.Fatalf("CheckKey: %+v %v", rr, err)
	}
	if err := p.Reset(ctx, "global", "all"); err != nil {
		t.Fatal(err)
	}
	if s := p.LocalBudgets().Stats(); s.Entries != 0 {
		t.Errorf("after Reset: %+v", s)
	}
}

// TestLeaseParallel: 64 goroutines on one leased key admit exactly the
// limit (one instance holds all the units, so it spends them all).
func TestLeaseParallel(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	p := mustPolicy(t, "rules:\n  - {name: g, identity: const:all, limit: 1000/m, algorithm: sliding_window, lease: 50}\n", store, WithClock(clock.Now))
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				if p.Check(ctx, req("GET", "/")).Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 1000 {
		t.Errorf("admitted %d, want 1000", admitted.Load())
	}
	if n := store.Calls.Load(); n > 1000/50+5 {
		t.Errorf("%d store calls for 1000 admitted with lease 50", n)
	}
}

// TestInstancesAuto: instances: auto divides by the live count, never
// below the floor; the count also caps a lease at rate / instances.
func TestInstancesAuto(t *testing.T) {
	var live atomic.Int64
	live.Store(1)
	doc := `
instances: auto
instances_floor: 2
rules:
  - {name: g, identity: const:all, limit: 100/m, algorithm: fixed_window, lease: 40}
`
	p := mustPolicy(t, doc, nil, WithInstances(func() int { return int(live.Load()) }))
	if p.Instances() != 2 {
		t.Errorf("one live, floor 2: %d", p.Instances())
	}
	live.Store(5)
	if p.Instances() != 5 {
		t.Errorf("five live: %d", p.Instances())
	}
	// 100 / 5 = 20 per lease: the first call takes 20.
	p.Check(ctx, req("GET", "/"))
	if s := p.LocalBudgets().Stats(); s.Taken != 20 {
		t.Errorf("lease under 5 instances took %d, want 20", s.Taken)
	}
	if q := mustPolicy(t, doc, nil); q.Instances() != 2 {
		t.Errorf("auto without a fleet: %d, want the floor", q.Instances())
	}
	if q := mustPolicy(t, "instances: 3\n", nil, WithInstances(func() int { return 9 })); q.Instances() != 3 {
		t.Errorf("static 3: %d", q.Instances())
	}
	if _, err := Parse([]byte("instances: many\n"), "i.yaml"); err == nil || !strings.Contains(err.Error(), "i.yaml:1:12") {
		t.Errorf("instances: many: %v", err)
	}
	// The local fallback divides by the live count.
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 100, Period: time.Minute}
	if got := guard.LocalLimit(l, p.Instances()).Rate; got != 20 {
		t.Errorf("local share %d", got)
	}
}

// TestInstancesAutoFallback: while the store fails, on_error: local
// enforces the limit divided by the live count.
func TestInstancesAutoFallback(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	p := mustPolicy(t, `
instances: auto
store: {on_error: local}
rules:
  - {name: g, identity: const:all, limit: 8/m, algorithm: fixed_window}
`, store, WithClock(clock.Now), WithInstances(func() int { return 4 }))
	store.Down.Store(true)
	admitted := 0
	for range 5 {
		if v := p.Check(ctx, req("GET", "/")); v.Allowed {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("local fallback under 4 live instances admitted %d of 8/m, want 2", admitted)
	}
}

// TestLeasedRulesAllOrNothing: when a later leased rule refuses a request,
// the leased rules that admitted it give their units back, as the store's
// rules are all or nothing.
func TestLeasedRulesAllOrNothing(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	p := mustPolicy(t, `
rules:
  - {name: global, identity: const:all, limit: 100/m, algorithm: fixed_window, lease: 10}
  - {name: tenant, identity: const:t, limit: 5/m, algorithm: fixed_window, lease: 5}
`, store, WithClock(clock.Now))
	admitted := 0
	for range 30 {
		if v := p.Check(ctx, from(req("GET", "/"), "192.0.2.1:1")); v.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d, want the tenant's 5", admitted)
	}
	// 5 admitted requests spent 5 of global's units; the 25 the tenant
	// refused gave theirs back.
	if s := p.LocalBudgets().Stats(); s.Spent != 10 {
		t.Errorf("spent %d units, want 10 (5 from each rule)", s.Spent)
	}
}
