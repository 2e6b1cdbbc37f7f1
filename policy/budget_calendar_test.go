package policy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/store/redisstore"
	"github.com/weir-dev/weir/storetest"
)

// calendarStores returns, for a test clock, a memstore and a store on a
// real Redis that both read it.
func calendarStores(t *testing.T, clock *storetest.Clock) map[string]weir.Store {
	t.Helper()
	rs, err := redisstore.New(context.Background(), redisstore.Config{Addrs: []string{redistest.Standalone(t).Addr}, Timeout: 10 * time.Second, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return map[string]weir.Store{"memstore": memstore.New(memstore.WithClock(clock.Now)), "redis": rs}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestBudgetCalendarResetsInZone: a monthly budget in New York resets at
// New York's midnight on the 1st (05:00 UTC), not at UTC's; a daily one
// in Tokyo with reset_at at 09:00 local (00:00 UTC). A settlement over the
// estimate puts the month in debt, which ends with the month: the next
// month starts with the whole budget. Both stores, on a controlled clock.
func TestBudgetCalendarResetsInZone(t *testing.T) {
	const doc = budgetPrices + `
rules:
  - {name: monthly, identity: header:X-Key, budget: 1 USD/month, timezone: America/New_York}
  - {name: daily, identity: header:X-Team, budget: 0.1 USD/day, timezone: Asia/Tokyo, reset_at: "09:00"}
`
	clock := storetest.NewClock(mustTime(t, "2030-01-31T20:00:00Z")) // 15:00 in New York
	for name, store := range calendarStores(t, clock) {
		t.Run(name, func(t *testing.T) {
			clock.Set(mustTime(t, "2030-01-31T20:00:00Z"))
			p := mustPolicy(t, doc, store)
			out := func(tokens int64) context.Context { // tokens × 10 µUSD
				return WithUsage(ctx, Usage{Model: "gpt-4o", OutputTokens: tokens})
			}
			left := func(rule, key string) weir.Result {
				t.Helper()
				rr, err := p.CheckKey(ctx, KeyRequest{Rule: rule, Key: key, N: 0})
				if err != nil || rr.Err != nil {
					t.Fatal(err, rr.Err)
				}
				return rr.Result
			}
			// 500,000 estimated, 700,000 used: a debit of 200,000.
			v := p.Check(out(50_000), req("POST", "/", "X-Key", "k"))
			if !v.Allowed || v.Results[0].Cost != 500_000 {
				t.Fatalf("first request: %+v", v)
			}
			if v.Results[0].Limit.Calendar != 3 || v.Results[0].Limit.Timezone != "America/New_York" {
				t.Fatalf("limit %+v, want a calendar month in New York", v.Results[0].Limit)
			}
			if err := p.Finish(ctx, &v, Charges{Usage: &Usage{Model: "gpt-4o", OutputTokens: 70_000}}); err != nil {
				t.Fatal(err)
			}
			if r := left("monthly", "k"); r.Remaining != 300_000 {
				t.Fatalf("remaining %d after 700,000 spent, want 300,000", r.Remaining)
			}
			// 400,000 does not fit: retry at New York's midnight, 9h away.
			v = p.Check(out(40_000), req("POST", "/", "X-Key", "k"))
			if rr, _ := v.Limited(); v.Allowed || rr.Result.RetryAfter != 9*time.Hour {
				t.Fatalf("400,000 with 300,000 left: %+v", v)
			}
			// 200,000 fits; it uses 500,000: the month ends 200,000 over.
			v = p.Check(out(20_000), req("POST", "/", "X-Key", "k"))
			if !v.Allowed {
				t.Fatalf("200,000 with 300,000 left: %+v", v)
			}
			if err := p.Finish(ctx, &v, Charges{Usage: &Usage{Model: "gpt-4o", OutputTokens: 50_000}}); err != nil {
				t.Fatal(err)
			}
			if r := left("monthly", "k"); r.Remaining != 0 || r.ResetAfter != 9*time.Hour {
				t.Fatalf("in debt: %+v, want nothing left until New York's midnight", r)
			}
			// UTC's month starts; New York's has not.
			clock.Set(mustTime(t, "2030-02-01T04:59:59.999999Z"))
			if v := p.Check(out(1), req("POST", "/", "X-Key", "k")); v.Allowed {
				t.Fatal("admitted before New York's month started")
			}
			clock.Set(mustTime(t, "2030-02-01T05:00:00Z"))
			if r := left("monthly", "k"); r.Remaining != 1_000_000 {
				t.Fatalf("New York's February: %d left, want the whole budget (the debt stays in January)", r.Remaining)
			}
			v = p.Check(out(100_000), req("POST", "/", "X-Key", "k"))
			if !v.Allowed {
				t.Fatalf("the whole budget in February: %+v", v)
			}
			if err := p.Finish(ctx, &v, Charges{Usage: &Usage{Model: "gpt-4o", OutputTokens: 30_000}}); err != nil {
				t.Fatal(err)
			}
			if r := left("monthly", "k"); r.Remaining != 700_000 {
				t.Fatalf("after a refund of 700,000: %d left, want 700,000", r.Remaining)
			}

			// Tokyo's day starts at 09:00 local, 00:00 UTC.
			clock.Set(mustTime(t, "2030-02-01T23:00:00Z"))
			v = p.Check(out(10_000), req("POST", "/", "X-Team", "tm"))
			if !v.Allowed {
				t.Fatalf("daily: %+v", v)
			}
			if err := p.Finish(ctx, &v, Charges{Usage: &Usage{Model: "gpt-4o", OutputTokens: 9_000}}); err != nil {
				t.Fatal(err)
			}
			if r := left("daily", "tm"); r.Remaining != 10_000 || r.ResetAfter != time.Hour {
				t.Fatalf("daily: %+v, want 10,000 left for an hour", r)
			}
			clock.Set(mustTime(t, "2030-02-02T00:00:00Z"))
			if r := left("daily", "tm"); r.Remaining != 100_000 {
				t.Fatalf("Tokyo's next day: %d left, want 100,000", r.Remaining)
			}
		})
	}
}

const calendarHierarchyRules = `
rules:
  - {name: key-budget, identity: header:X-Key, budget: 0.3 USD/month, timezone: Europe/Paris}
  - {name: team-budget, identity: header:X-Team, budget: 0.4 USD/week, timezone: Europe/Paris}
  - {name: org-budget, identity: header:X-Org, budget: 0.6 USD/day, timezone: Europe/Paris, reset_at: "06:00"}
`

// calendarHierarchyClock is a fixed instant inside every calendar window
// of calendarHierarchyRules, so that no window ends during the run.
func calendarHierarchyClock(t *testing.T) *storetest.Clock {
	return storetest.NewClock(mustTime(t, "2030-06-12T12:00:00Z"))
}

// The hierarchy in calendar windows: the same bound and accounting as
// TestBudgetHierarchy*, the levels a month, a week and a day in Paris.
func TestBudgetCalendarHierarchyMemstore(t *testing.T) {
	for _, over := range []bool{false, true} {
		clock := calendarHierarchyClock(t)
		p := mustPolicy(t, budgetPrices+calendarHierarchyRules, memstore.New(memstore.WithClock(clock.Now)))
		runHierarchy(t, []*Policy{p}, 20, over, false)
	}
}

// TestBudgetCalendarHierarchyRedisTwoPolicies: two policies (two weir
// instances) on one real Redis, estimates honoured and exceeded.
func TestBudgetCalendarHierarchyRedisTwoPolicies(t *testing.T) {
	for _, over := range []bool{false, true} {
		clock := calendarHierarchyClock(t)
		addr := redistest.Standalone(t).Addr
		doc := budgetPrices + "store: {timeout: 10s}\n" + calendarHierarchyRules
		var ps []*Policy
		for range 2 {
			s, err := redisstore.New(context.Background(), redisstore.Config{Addrs: []string{addr}, Timeout: 10 * time.Second, Clock: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			ps = append(ps, mustPolicy(t, doc, s))
		}
		runHierarchy(t, ps, 10, over, false)
	}
}

// TestBudgetTrustedHeaderLevels: a level named by trusted_header: is read
// only from a request whose direct peer is a trusted proxy (the
// authenticator that sets it); a client's own header is no level, so it
// cannot charge another team's budget, and on_missing: deny refuses it.
func TestBudgetTrustedHeaderLevels(t *testing.T) {
	const doc = budgetPrices + `
trusted_proxies: [10.0.0.0/8]
rules:
  - {name: team-budget, identity: "trusted_header:X-Team", budget: 1 USD/day}
  - {name: org-budget, identity: "trusted_header:X-Org", budget: 5 USD/month, timezone: Europe/Paris, on_missing: deny}
`
	p := mustPolicy(t, doc, memstore.New())
	cx := WithUsage(ctx, Usage{Model: "gpt-4o", OutputTokens: 1000}) // 10,000
	charged := func(v Verdict) map[string]string {
		m := map[string]string{}
		for _, rr := range v.Results {
			if !rr.Skipped {
				m[rr.Rule] = rr.Identity
			}
		}
		return m
	}
	v := p.Check(cx, from(req("POST", "/", "X-Team", "t1", "X-Org", "o1"), "10.1.2.3:5000"))
	if got := charged(v); !v.Allowed || got["team-budget"] != "t1" || got["org-budget"] != "o1" {
		t.Fatalf("from a trusted proxy: allowed %v, charged %v", v.Allowed, got)
	}
	// The same headers straight from a client: no levels; the org's
	// on_missing: deny refuses.
	v = p.Check(cx, from(req("POST", "/", "X-Team", "t1", "X-Org", "o1"), "192.0.2.7:5000"))
	if got := charged(v); v.Allowed || got["team-budget"] != "" {
		t.Fatalf("from a client: allowed %v, charged %v", v.Allowed, got)
	}
	rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "team-budget", Key: "t1", N: 0})
	if rr.Result.Remaining != 1_000_000-10_000 {
		t.Errorf("team t1: %d left, want %d (only the trusted request charged)", rr.Result.Remaining, 1_000_000-10_000)
	}
	// Without trusted_proxies, trusted_header is refused.
	_, err := Parse([]byte(budgetPrices+"rules:\n  - {name: a, identity: \"trusted_header:X-Team\", budget: 1 USD/day}\n"), "w.yaml")
	if err == nil || !strings.Contains(err.Error(), `w.yaml:9:25: identity "trusted_header:X-Team" reads its header only from trusted_proxies`) {
		t.Errorf("trusted_header without trusted_proxies: %v", err)
	}
}

// TestBudgetRuleInfo: a budget rule describes its limit in money, with
// its currency and calendar; a cost_expr rule counting tokens has none.
func TestBudgetRuleInfo(t *testing.T) {
	p := mustPolicy(t, budgetPrices+`
rules:
  - {name: monthly, identity: header:X-Key, budget: 10 USD/month, timezone: Europe/Paris}
  - {name: daily, identity: header:X-Key, budget: 0.05 usd/d}
  - {name: tokens, identity: header:X-Key, limit: 1000/d, cost_expr: "output_tokens"}
`, memstore.New())
	got := map[string]RuleInfo{}
	for _, ri := range p.Rules() {
		got[ri.Name] = ri
	}
	for _, c := range []struct{ rule, limit, currency, tz string }{
		{"monthly", "10 USD/month", "USD", "Europe/Paris"},
		{"daily", "0.05 USD/d", "USD", ""},
		{"tokens", "1000/d", "", ""},
	} {
		ri := got[c.rule]
		if ri.Limit != c.limit || ri.Currency != c.currency || ri.Timezone != c.tz {
			t.Errorf("%s: limit %q currency %q timezone %q, want %q %q %q", c.rule, ri.Limit, ri.Currency, ri.Timezone, c.limit, c.currency, c.tz)
		}
	}
}

// TestBudgetCalendarSequentialBound: with one request in flight at a
// time, a calendar budget is passed by at most the last admitted
// request's actual cost over its estimate (every earlier one was settled
// before the next was admitted, and the last fitted by its estimate); the
// store holds exactly the settled costs. Both stores.
func TestBudgetCalendarSequentialBound(t *testing.T) {
	const doc = budgetPrices + `
rules:
  - {name: monthly, identity: header:X-Key, budget: 2 USD/month, timezone: Asia/Kolkata}
`
	clock := storetest.NewClock(mustTime(t, "2030-03-15T10:00:00Z"))
	for name, store := range calendarStores(t, clock) {
		t.Run(name, func(t *testing.T) {
			p := mustPolicy(t, doc, store)
			const budget = 2_000_000
			var spent, lastExcess int64
			for i := 0; ; i++ {
				est := int64(5_000 + i*997%20_000)        // output tokens: × 10 µUSD
				act := est + int64(i*7919%13_000) - 4_000 // some under, some over
				v := p.Check(WithUsage(ctx, Usage{Model: "gpt-4o", OutputTokens: est}), req("POST", "/", "X-Key", "k"))
				if !v.Allowed {
					break
				}
				if i > 1000 {
					t.Fatal("never refused")
				}
				if err := p.Finish(ctx, &v, Charges{Usage: &Usage{Model: "gpt-4o", OutputTokens: act}}); err != nil {
					t.Fatal(err)
				}
				spent += act * 10
				lastExcess = (act - est) * 10
			}
			if spent > budget && spent-budget > lastExcess {
				t.Errorf("spent %d of %d: over by more than the last request's excess %d", spent, budget, lastExcess)
			}
			rr, err := p.CheckKey(ctx, KeyRequest{Rule: "monthly", Key: "k", N: 0})
			if err != nil || rr.Result.Remaining != max(budget-spent, 0) {
				t.Errorf("store has %d left (%v), the charges say %d", rr.Result.Remaining, err, max(budget-spent, 0))
			}
		})
	}
}

// TestBudgetCalendarHierarchyRedisCluster: the calendar hierarchy on
// Redis Cluster, whose levels lie in different slots: what a slot took is
// given back (a refund in the same calendar window) when another refused.
func TestBudgetCalendarHierarchyRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("Redis Cluster in -short")
	}
	c := redistest.Cluster(t)
	clock := calendarHierarchyClock(t)
	doc := budgetPrices + "store: {timeout: 10s}\n" + calendarHierarchyRules
	var ps []*Policy
	for range 2 {
		s, err := redisstore.New(context.Background(), redisstore.Config{Addrs: c.Addrs, Timeout: 10 * time.Second, Clock: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		ps = append(ps, mustPolicy(t, doc, s))
	}
	runHierarchy(t, ps, 5, false, true)
}
