package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/redisstore"
)

// envInt reads a positive integer from the environment, or def.
func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// usd writes micro-units as a budget amount.
func usd(micro int64) string { return fmt.Sprintf("%d.%06d", micro/1_000_000, micro%1_000_000) }

// TestConcurrentTenants: tenants API keys (100; WEIR_GATEWAY_TENANTS),
// two per user, ten per team, fifty per organisation, each sending
// streams concurrent requests (4; WEIR_GATEWAY_STREAMS=64 for the full
// size) through the gateway, in both formats, JSON and streamed, some
// hanging up mid-stream. Each level's ledger is checked: the store holds
// exactly its budget less the sum of its admitted requests' usage ×
// prices, and no level passes its budget — by nothing when every usage
// fits its estimate, and by at most the sum of (actual − estimate) of the
// requests admitted under it (a superset of those in flight together)
// when some usage does not.
func TestConcurrentTenants(t *testing.T) {
	for _, over := range []bool{false, true} {
		t.Run(fmt.Sprintf("over=%t", over), func(t *testing.T) { runTenants(t, over, nil) })
	}
}

// TestConcurrentTenantsRedis is TestConcurrentTenants through two
// gateways (two policies) sharing one real Redis, the requests of each
// key alternating between them.
func TestConcurrentTenantsRedis(t *testing.T) {
	for _, over := range []bool{false, true} {
		t.Run(fmt.Sprintf("over=%t", over), func(t *testing.T) {
			addr := redistest.Standalone(t).Addr
			runTenants(t, over, func() weir.Store {
				s, err := redisstore.New(context.Background(), redisstore.Config{Addrs: []string{addr}, Timeout: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			})
		})
	}
}

// runTenants runs the load on one gateway over memstore (store nil), or
// on two over a store each from store.
func runTenants(t *testing.T, over bool, store func() weir.Store) {
	nKeys := envInt(t, "WEIR_GATEWAY_TENANTS", 100)
	streams := envInt(t, "WEIR_GATEWAY_STREAMS", 4)
	const maxTokens = 1000
	// Budgets that bind at every level: a key's streams estimate about
	// 14,000 micro-units each and use about a third of that.
	budgets := map[string]int64{
		"key-budget":  int64(streams) * 8_000,
		"user-budget": int64(streams) * 12_000,
		"team-budget": int64(streams) * 40_000,
		"org-budget":  int64(streams) * 150_000,
	}
	rules := testPrices + fmt.Sprintf(`
store: {timeout: 10s}
rules:
  - {name: key-budget,  identity: header:X-Weir-Key,  on_missing: deny, budget: %s USD/d}
  - {name: user-budget, identity: header:X-Weir-User, on_missing: skip, budget: %s USD/d}
  - {name: team-budget, identity: header:X-Weir-Team, on_missing: skip, budget: %s USD/d}
  - {name: org-budget,  identity: header:X-Weir-Org,  on_missing: skip, budget: %s USD/30d}
`, usd(budgets["key-budget"]), usd(budgets["user-budget"]), usd(budgets["team-budget"]), usd(budgets["org-budget"]))
	ts := tenants{}
	levels := func(k int) [4][2]string {
		return [4][2]string{
			{"key-budget", keyID(fmt.Sprintf("sk-%d", k))},
			{"user-budget", fmt.Sprintf("u%d", k/2)},
			{"team-budget", fmt.Sprintf("t%d", k/10)},
			{"org-budget", fmt.Sprintf("o%d", k/50)},
		}
	}
	for k := range nKeys {
		l := levels(k)
		ts[l[0][1]] = tenant{User: l[1][1], Team: l[2][1], Org: l[3][1]}
	}
	up := newFakeUpstream(t)
	close(up.release)
	var gs []*testGateway
	if store == nil {
		gs = append(gs, newTestGateway(t, up, rules, ts, time.Minute))
	} else {
		gs = append(gs, newTestGatewayOn(t, up, rules, ts, time.Minute, store()), newTestGatewayOn(t, up, rules, ts, time.Minute, store()))
	}

	var mu sync.Mutex
	spent := map[[2]string]int64{}  // level → usage × prices of its admitted requests
	excess := map[[2]string]int64{} // level → Σ (actual − estimate) of those over their estimate
	refused := map[string]int{}
	admitted, hungUp := 0, 0
	var wg sync.WaitGroup
	for k := range nKeys {
		for i := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				path, model, stream := chatPath, "gpt-t", (k+i)%2 == 1
				f := openAI
				if (k+i)%4 >= 2 {
					path, model, f = messagesPath, "claude-t", anthropic
				}
				x := knobs{In: 20 + int64(i%5)*10, Cached: int64(i%3) * 20, Out: int64(i%10) * 80}
				if f == openAI {
					x.Reasoning = int64(i%4) * 60
				} else {
					x.CacheW = int64(i%2) * 20
				}
				if over && i%5 == 0 {
					x.Out = 3 * maxTokens // the upstream did not honour max_tokens
				}
				extra := ""
				if stream {
					extra = `"stream":true`
				}
				b := body(model, maxTokens, x, extra)
				est, out, err := prepare(f, []byte(b))
				if err != nil {
					t.Error(err)
					return
				}
				estimate := estimateOf(model, len(out), est.OutputTokens)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				resp := gs[i%len(gs)].post(ctx, path, fmt.Sprintf("sk-%d", k), b)
				hangUp := (k+i)%8 == 3 // streamed: k+i is odd
				if hangUp && resp.StatusCode == 200 {
					bufio.NewReader(resp.Body).ReadString('\n')
					cancel()
				}
				rb, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				switch resp.StatusCode {
				case 200:
					admitted++
					if hangUp {
						hungUp++
					}
					c := costOf(model, x)
					for _, l := range levels(k) {
						spent[l] += c
						excess[l] += max(0, c-estimate)
					}
					if !over && c > estimate {
						t.Errorf("a usage of %d over its estimate %d without over", c, estimate)
					}
				case 429:
					var p struct{ Rule string }
					json.Unmarshal(rb, &p)
					refused[p.Rule]++
				default:
					t.Errorf("%s sk-%d: %d %s", path, k, resp.StatusCode, rb)
				}
			}()
		}
	}
	wg.Wait()
	for _, g := range gs {
		g.served.Wait() // every settlement, hang-ups' included, is done
	}
	g := gs[0]
	if t.Failed() {
		return
	}
	t.Logf("%d keys × %d streams: %d admitted (%d hung up), refused by level %v", nKeys, streams, admitted, hungUp, refused)
	overruns := 0
	for l, s := range spent {
		b := budgets[l[0]]
		if s > b {
			overruns++
		}
		if s > b+excess[l] {
			t.Errorf("%s %s spent %d, over its budget %d by more than its requests' excess %d", l[0], l[1], s, b, excess[l])
		}
		left := g.left(l[0], l[1])
		switch {
		case s <= b && left != b-s:
			t.Errorf("%s %s: the store has %d left, the usage × prices say %d", l[0], l[1], left, b-s)
		case s > b && left != 0:
			t.Errorf("%s %s: spent %d of %d and still %d left", l[0], l[1], s, b, left)
		}
	}
	totalExcess := int64(0)
	for l, e := range excess {
		if l[0] == "org-budget" {
			totalExcess += e
		}
	}
	t.Logf("%d levels over their budgets; admitted usage over its estimates by %d micro-units in all", overruns, totalExcess)
	switch {
	case !over && overruns > 0:
		t.Errorf("%d levels over their budgets with usage within its estimates", overruns)
	case over && totalExcess == 0:
		// Whether a level then ends past its budget depends on the order
		// requests settle in; TestUsageOverEstimate passes one for sure.
		t.Error("no admitted usage passed its estimate: the bound was not put to the test")
	}
	// Through two gateways, which level a refusal names depends on the
	// order racing requests reach Redis: an organisation's budget may run
	// out before any of its keys' does. There, the organisations must bind.
	binding := []string{"key-budget", "org-budget"}
	if len(gs) > 1 {
		binding = binding[1:]
	}
	for _, rule := range binding {
		if refused[rule] == 0 {
			t.Errorf("refusals by level %v: %s never bound, the test checks nothing there", refused, rule)
		}
	}
	if hungUp == 0 {
		t.Error("no admitted request hung up")
	}
}
