package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/price"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

const budgetPrices = `
prices:
  currency: USD
  models:
    gpt-4o: {input: 2.50, cached_input: 1.25, output: 10}
    o3: {input: 2, cached_input: 0.5, output: 8, reasoning: 8}
  unknown: refuse
`

func TestBudgetValidationPositions(t *testing.T) {
	doc := `prices:
  currency: usd
  models:
    gpt-4o: {input: 2.5x, output: 10}
    o1: {input: 1}
    claude: {input: 3, output: 15, cache_write: -3.75}
  unknown: maybe
rules:
  - {name: a, identity: header:X-Key, budget: 10 USD/fortnight}
  - {name: b, identity: header:X-Key, budget: ten dollars}
  - {name: c, identity: header:X-Key, limit: 100/m, cost_expr: "input_tokens + bogus"}
  - {name: d, identity: header:X-Key, limit: 100/m, cost_expr: "double(output_tokens)"}
  - {name: e, identity: header:X-Key, budget: 5 USD/day, limit: 10/m}
`
	_, err := Parse([]byte(doc), "weir.yaml")
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{
		`weir.yaml:2:13: prices needs a currency of 3 upper-case letters`,
		`weir.yaml:4:21: price "2.5x" is not a decimal number`,
		`weir.yaml:5:9: a model's prices need input and output`,
		`weir.yaml:6:49: price "-3.75" is not a decimal number`,
		`weir.yaml:7:12: unknown must be refuse or prices`,
		`weir.yaml:9:47: budget "10 USD/fortnight": period "fortnight"`,
		`weir.yaml:10:47: budget "ten dollars" is not an amount`,
		`weir.yaml:11:64: cost_expr "input_tokens + bogus": at line 1, column 16 of the expression: undeclared reference to 'bogus'`,
		`weir.yaml:12:64: cost_expr "double(output_tokens)": the cost expression gives double`,
		`limit and budget are exclusive`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	_, err = Parse([]byte("rules:\n  - {name: a, budget: 10 USD/30d}\n"), "w.yaml")
	if err == nil || !strings.Contains(err.Error(), "w.yaml:2:23: a budget prices usage by the prices section") {
		t.Errorf("a budget without prices: %v", err)
	}
	_, err = Parse([]byte(budgetPrices+"rules:\n  - {name: a, identity: header:X-Key, budget: 10 USD/month, algorithm: gcra}\n"), "w.yaml")
	if err == nil || !strings.Contains(err.Error(), `apply to fixed_window, not gcra`) {
		t.Errorf("a calendar budget on gcra: %v", err)
	}
	_, err = Parse([]byte(budgetPrices+"rules:\n  - {name: a, budget: 10 EUR/month}\n"), "w.yaml")
	if err == nil || !strings.Contains(err.Error(), `is in EUR, but prices are in USD`) {
		t.Errorf("a budget in another currency: %v", err)
	}
}

// TestBudgetReserveSettle checks a budget's ledger on one key: the
// estimate is priced from the request's usage estimate, the settlement
// from its reported usage, and the budget refuses what would pass it.
func TestBudgetReserveSettle(t *testing.T) {
	p := mustPolicy(t, budgetPrices+`
rules:
  - {name: spend, identity: header:X-Key, budget: 0.05 USD/d}
`, memstore.New())
	cx := WithUsage(ctx, Usage{Model: "gpt-4o", InputTokens: 1000, OutputTokens: 1000})
	v := p.Check(cx, req("POST", "/v1/chat", "X-Key", "k1"))
	if !v.Allowed || v.Results[0].Cost != 2500+10000 {
		t.Fatalf("estimate: %+v", v)
	}
	if v.Results[0].Limit.Period != 24*time.Hour || v.Results[0].Limit.Rate != 50_000 {
		t.Fatalf("limit %+v, want 50000 micro-units a day", v.Results[0].Limit)
	}
	// Reported: 800 input of which 600 cached, 300 output.
	if err := p.Finish(ctx, &v, Charges{Usage: &Usage{Model: "gpt-4o", InputTokens: 200, CachedInputTokens: 600, OutputTokens: 300}}); err != nil {
		t.Fatal(err)
	}
	spent := int64(500 + 750 + 3000)
	rr, err := p.CheckKey(ctx, KeyRequest{Rule: "spend", Key: "k1", N: 0})
	if err != nil || rr.Result.Remaining != 50_000-spent {
		t.Fatalf("remaining %d (%v), want %d", rr.Result.Remaining, err, 50_000-spent)
	}
	// An unknown model is refused as a bad cost; so is a request without
	// an estimate.
	if v := p.Check(WithUsage(ctx, Usage{Model: "mystery", InputTokens: 1}), req("POST", "/", "X-Key", "k1")); !errors.Is(v.BadCost, ErrBadCost) || !strings.Contains(v.BadCost.Error(), "unknown model") {
		t.Errorf("unknown model: %+v", v)
	}
	if v := p.Check(ctx, req("POST", "/", "X-Key", "k1")); !errors.Is(v.BadCost, ErrBadCost) {
		t.Errorf("no estimate: %+v", v)
	}
	// An estimate larger than what is left is refused and takes nothing.
	big := WithUsage(ctx, Usage{Model: "gpt-4o", OutputTokens: 5000})
	if v := p.Check(big, req("POST", "/", "X-Key", "k1")); v.Allowed {
		t.Fatalf("an estimate of 50000 admitted with %d left", 50_000-spent)
	}
	rr, _ = p.CheckKey(ctx, KeyRequest{Rule: "spend", Key: "k1", N: 0})
	if rr.Result.Remaining != 50_000-spent {
		t.Errorf("a refused request took %d", 50_000-spent-rr.Result.Remaining)
	}
}

// TestBudgetCacheWrites: a usage's cache writes settle at the model's
// cache_write price, or at its input price when the table gives none.
func TestBudgetCacheWrites(t *testing.T) {
	p := mustPolicy(t, strings.Replace(budgetPrices, "    o3:", "    claude: {input: 3, cached_input: 0.3, output: 15, cache_write: 3.75}\n    o3:", 1)+`
rules:
  - {name: spend, identity: header:X-Key, budget: 1 USD/d}
`, memstore.New())
	for _, c := range []struct {
		model string
		want  int64 // 1000 cache writes, 100 input, 10 output
	}{{"claude", 3750 + 300 + 150}, {"gpt-4o", 2500 + 250 + 100}} {
		key := "k-" + c.model
		v := p.Check(WithUsage(ctx, Usage{Model: c.model, InputTokens: 1100, OutputTokens: 10}), req("POST", "/", "X-Key", key))
		if !v.Allowed {
			t.Fatalf("%s: %+v", c.model, v)
		}
		if err := p.Finish(ctx, &v, Charges{Usage: &Usage{Model: c.model, InputTokens: 100, CacheWriteTokens: 1000, OutputTokens: 10}}); err != nil {
			t.Fatal(err)
		}
		rr, err := p.CheckKey(ctx, KeyRequest{Rule: "spend", Key: key, N: 0})
		if err != nil || rr.Result.Remaining != 1_000_000-c.want {
			t.Errorf("%s: spent %d (%v), want %d", c.model, 1_000_000-rr.Result.Remaining, err, c.want)
		}
	}
}

// TestBudgetPricesReloadKeepsCounts: new prices written to the watched
// config file reach the policy by a reload (Watch), on memstore and on
// Redis: what was spent stays counted, later requests cost the new prices.
func TestBudgetPricesReloadKeepsCounts(t *testing.T) {
	clock := storetest.NewClock(mustTime(t, "2030-01-15T12:00:00Z"))
	for name, store := range calendarStores(t, clock) {
		t.Run(name, func(t *testing.T) {
			const rules = "rules:\n  - {name: spend, identity: header:X-Key, budget: 1 USD/month, timezone: Europe/Paris}\nstore: {timeout: 10s}\n"
			path := filepath.Join(t.TempDir(), "weir.yaml")
			if err := os.WriteFile(path, []byte(budgetPrices+rules), 0o600); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			h, err := Watch(wctx, path, func(c *config.Config) (*Policy, error) { return New(c, store) }, nil, WatchLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			// 100,000 input tokens at 2.50 per million: 250,000 micro-units.
			v := h.Load().Check(WithUsage(ctx, Usage{Model: "gpt-4o", InputTokens: 100_000}), req("POST", "/", "X-Key", "k"))
			if !v.Allowed || v.Results[0].Cost != 250_000 {
				t.Fatalf("before the reload: %+v", v)
			}
			doubled := strings.Replace(budgetPrices, "gpt-4o: {input: 2.50", "gpt-4o: {input: 5", 1)
			if err := os.WriteFile(path, []byte(doubled+rules), 0o600); err != nil {
				t.Fatal(err)
			}
			for h.ReloadsOK() == 0 {
				if h.ReloadsFailed() > 0 {
					t.Fatal("the reload failed")
				}
				time.Sleep(10 * time.Millisecond)
			}
			p2 := h.Load()
			rr, err := p2.CheckKey(ctx, KeyRequest{Rule: "spend", Key: "k", N: 0})
			if err != nil || rr.Result.Remaining != 1_000_000-250_000 {
				t.Fatalf("after the reload %d left (%v), want %d: the spend was lost", rr.Result.Remaining, err, 750_000)
			}
			v = p2.Check(WithUsage(ctx, Usage{Model: "gpt-4o", InputTokens: 100_000}), req("POST", "/", "X-Key", "k"))
			if !v.Allowed || v.Results[0].Cost != 500_000 {
				t.Fatalf("after the reload: %+v", v)
			}
			rr, _ = p2.CheckKey(ctx, KeyRequest{Rule: "spend", Key: "k", N: 0})
			if rr.Result.Remaining != 1_000_000-250_000-500_000 {
				t.Errorf("remaining %d, want %d", rr.Result.Remaining, 250_000)
			}
		})
	}
}

func TestCostExprRule(t *testing.T) {
	// A token limit counted by an expression: output tokens weigh 4.
	p := mustPolicy(t, `
rules:
  - {name: tokens, identity: header:X-Key, limit: 10000/h, algorithm: fixed_window, cost_expr: "input_tokens + 4 * (output_tokens + reasoning_tokens)"}
`, memstore.New())
	v := p.Check(WithUsage(ctx, Usage{Model: "any", InputTokens: 100, OutputTokens: 200}), req("POST", "/", "X-Key", "k"))
	if !v.Allowed || v.Results[0].Cost != 900 {
		t.Fatalf("%+v", v)
	}
	if err := p.Finish(ctx, &v, Charges{Usage: &Usage{Model: "any", InputTokens: 100, OutputTokens: 50, ReasoningTokens: 25}}); err != nil {
		t.Fatal(err)
	}
	rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "tokens", Key: "k", N: 0})
	if rr.Result.Remaining != 10000-400 {
		t.Errorf("remaining %d, want %d", rr.Result.Remaining, 10000-400)
	}
}

const hierarchyRules = `
rules:
  - {name: key-budget, identity: header:X-Key, budget: 0.3 USD/30d}
  - {name: team-budget, identity: header:X-Team, budget: 0.4 USD/30d}
  - {name: org-budget, identity: header:X-Org, budget: 0.6 USD/30d}
`

// runHierarchy sends, for each of orgs organisations with 2 teams of 2
// keys each, 64 concurrent requests per key through the policies in
// turn, settling each admitted one with its usage (over its estimate
// when over is set), and checks every level's ledger: no level spends
// more than its budget plus the excess over their estimates of the
// requests settled at once, and the store holds exactly what was
// charged.
func runHierarchy(t *testing.T, ps []*Policy, orgs int, over, cluster bool) {
	t.Helper()
	budgets := map[string]int64{"key-budget": 300_000, "team-budget": 400_000, "org-budget": 600_000}
	var mu sync.Mutex
	spent := map[[2]string]int64{} // {rule, identity} → micro-units settled
	maxExcess := int64(0)
	rejected := map[string]int{}
	var wg sync.WaitGroup
	for o := 0; o < orgs; o++ {
		for tm := 0; tm < 2; tm++ {
			for k := 0; k < 2; k++ {
				org, team, key := fmt.Sprintf("o%d", o), fmt.Sprintf("o%d-t%d", o, tm), fmt.Sprintf("o%d-t%d-k%d", o, tm, k)
				for i := 0; i < 64; i++ {
					wg.Add(1)
					go func(i int) {
						defer wg.Done()
						p := ps[i%len(ps)]
						est := Usage{Model: "gpt-4o", InputTokens: 1000, OutputTokens: 1000} // 12,500
						// Usage varies; under over, some exceed the estimate.
						act := Usage{Model: "gpt-4o", InputTokens: 400 + int64(i%7)*100, CachedInputTokens: 600 - int64(i%7)*100, OutputTokens: int64(i%10) * 100}
						if over && i%5 == 0 {
							act.OutputTokens = 1500
						}
						v := p.Check(WithUsage(ctx, est), req("POST", "/", "X-Key", key, "X-Team", team, "X-Org", org))
						if v.BadCost != nil {
							t.Error(v.BadCost)
							return
						}
						for _, rr := range v.Results {
							if rr.Err != nil {
								t.Error(rr.Err)
							}
						}
						if !v.Allowed {
							rr, _ := v.Limited()
							mu.Lock()
							rejected[rr.Rule]++
							mu.Unlock()
							return
						}
						if err := p.Finish(context.Background(), &v, Charges{Usage: &act}); err != nil {
							t.Error(err)
							return
						}
						c, _ := price.Cost(price.Model{Input: 2_500_000, CachedInput: 1_250_000, Output: 10_000_000, Reasoning: 10_000_000}, act.internal())
						mu.Lock()
						maxExcess = max(maxExcess, c-12_500)
						for _, id := range [][2]string{{"key-budget", key}, {"team-budget", team}, {"org-budget", org}} {
							spent[id] += c
						}
						mu.Unlock()
					}(i)
				}
			}
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The bound: every admitted estimate fit under the budget when taken,
	// and an estimate only grows by its request's excess at settlement;
	// the requests in flight together at one level are at most 64 per key.
	for id, s := range spent {
		b := budgets[id[0]]
		inFlight := int64(64)
		switch id[0] {
		case "team-budget":
			inFlight = 128
		case "org-budget":
			inFlight = 256
		}
		if !over && s > b {
			t.Errorf("%s %s spent %d, over its budget %d with estimates that bound usage", id[0], id[1], s, b)
		}
		if s > b+inFlight*max(maxExcess, 0) {
			t.Errorf("%s %s spent %d, over its budget %d by more than %d requests' excess of %d", id[0], id[1], s, b, inFlight, maxExcess)
		}
		// Accounting: what the store holds is what was charged.
		rr, err := ps[0].CheckKey(ctx, KeyRequest{Rule: id[0], Key: id[1], N: 0})
		if err != nil || rr.Err != nil {
			t.Fatal(err, rr.Err)
		}
		if s <= b && rr.Result.Remaining != b-s {
			t.Errorf("%s %s: the store has %d left, the charges say %d", id[0], id[1], rr.Result.Remaining, b-s)
		}
		if s > b && rr.Result.Remaining != 0 {
			t.Errorf("%s %s: spent %d of %d and still %d left", id[0], id[1], s, b, rr.Result.Remaining)
		}
	}
	// The budgets bound. On one memstore every level refuses some
	// requests. Across two instances (or Cluster slots), which level a
	// refusal names depends on the order the racing requests reach Redis:
	// an organisation's budget may run out before any of its keys' does.
	// There, at least the organisations must bind.
	if len(ps) == 1 && (rejected["org-budget"] == 0 || rejected["team-budget"] == 0 || rejected["key-budget"] == 0) {
		t.Errorf("rejections by level %v: a level never bound, the test checks nothing there", rejected)
	}
	if rejected["org-budget"] == 0 {
		t.Errorf("rejections by level %v: the organisations never bound, the test checks nothing there", rejected)
	}
	orgsCharged := 0
	for id := range spent {
		if id[0] == "org-budget" {
			orgsCharged++
		}
	}
	// On Cluster a request can be refused while another's take in a
	// slot it shares is about to be given back (under-admission, never
	// over-admission), so an organisation may end uncharged there.
	if orgsCharged != orgs && !cluster || orgsCharged == 0 {
		t.Errorf("%d organisations charged, want %d", orgsCharged, orgs)
	}
}

func TestBudgetHierarchyMemstore(t *testing.T) {
	p := mustPolicy(t, budgetPrices+hierarchyRules, memstore.New())
	runHierarchy(t, []*Policy{p}, 20, false, false)
}

func TestBudgetHierarchyMemstoreOverEstimate(t *testing.T) {
	p := mustPolicy(t, budgetPrices+hierarchyRules, memstore.New())
	runHierarchy(t, []*Policy{p}, 20, true, false)
}

// TestBudgetHierarchyRedisTwoPolicies runs the hierarchy through two
// policies (two weir instances) on one real Redis.
func TestBudgetHierarchyRedisTwoPolicies(t *testing.T) {
	addr := redistest.Standalone(t).Addr
	doc := budgetPrices + "store: {timeout: 10s}\n" + hierarchyRules
	p1 := mustPolicy(t, doc, redisStore(t, []string{addr}, 10*time.Second))
	p2 := mustPolicy(t, doc, redisStore(t, []string{addr}, 10*time.Second))
	runHierarchy(t, []*Policy{p1, p2}, 10, false, false)
}

func TestBudgetHierarchyRedisOverEstimate(t *testing.T) {
	addr := redistest.Standalone(t).Addr
	doc := budgetPrices + "store: {timeout: 10s}\n" + hierarchyRules
	p1 := mustPolicy(t, doc, redisStore(t, []string{addr}, 10*time.Second))
	p2 := mustPolicy(t, doc, redisStore(t, []string{addr}, 10*time.Second))
	runHierarchy(t, []*Policy{p1, p2}, 10, true, false)
}

// TestBudgetHierarchyRedisCluster runs the hierarchy on Redis Cluster,
// where a decision's levels lie in different slots: the store takes in
// each slot atomically and gives back what it took when another slot
// refused, so no level passes its budget and every micro-unit is
// accounted for (a concurrent request may see a take about to be given
// back, and be refused: under-admission, never over-admission).
func TestBudgetHierarchyRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("Redis Cluster in -short")
	}
	c := redistest.Cluster(t)
	doc := budgetPrices + "store: {timeout: 10s}\n" + hierarchyRules
	p1 := mustPolicy(t, doc, redisStore(t, c.Addrs, 10*time.Second))
	p2 := mustPolicy(t, doc, redisStore(t, c.Addrs, 10*time.Second))
	runHierarchy(t, []*Policy{p1, p2}, 5, false, true)
}

// TestBudgetLevelWithoutIdentitySkipped: a request whose authenticator
// set no team is charged at its key and organisation only.
func TestBudgetLevelWithoutIdentitySkipped(t *testing.T) {
	p := mustPolicy(t, budgetPrices+hierarchyRules, memstore.New())
	cx := WithUsage(ctx, Usage{Model: "o3", InputTokens: 100, OutputTokens: 100})
	v := p.Check(cx, req("POST", "/", "X-Key", "k", "X-Org", "o"))
	if !v.Allowed {
		t.Fatalf("%+v", v)
	}
	charged := map[string]int64{}
	for _, rr := range v.Results {
		if !rr.Skipped {
			charged[rr.Rule] = rr.Cost
		}
	}
	// o3: 100 × 2 + 100 × 8 per million, rounded up.
	if len(charged) != 2 || charged["key-budget"] != 1000 || charged["org-budget"] != 1000 {
		t.Errorf("charged %v, want key-budget and org-budget 1000 each", charged)
	}
	if err := p.Finish(ctx, &v, Charges{Usage: &Usage{Model: "o3", InputTokens: 100, CachedInputTokens: 0, OutputTokens: 20, ReasoningTokens: 30}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ rule, key string }{{"key-budget", "k"}, {"org-budget", "o"}} {
		rr, _ := p.CheckKey(ctx, KeyRequest{Rule: c.rule, Key: c.key, N: 0})
		b := map[string]int64{"key-budget": 300_000, "org-budget": 600_000}[c.rule]
		if rr.Result.Remaining != b-600 {
			t.Errorf("%s: %d left, want %d", c.rule, rr.Result.Remaining, b-600)
		}
	}
}
