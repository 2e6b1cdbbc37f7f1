package server

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/weir-dev/weir/internal/events"
	"github.com/weir-dev/weir/internal/redistest"
)

const budgetConfig = `
store: {timeout: 10s}
prices:
  currency: EUR
  models:
    gpt-4o: {input: 2.50, output: 10}
rules:
  - name: monthly
    identity: [header:X-Key]
    budget: 25 EUR/month
    timezone: Europe/Berlin
  - name: api
    identity: [header:X-Key]
    limit: 5/m
`

// TestBudgetUsageInMoney: a calendar budget reserved and settled over
// HTTP in micro-units reports its spend in GET /v1/usage with its currency
// and as decimal amounts, and GET /v1/rules shows its limit in money.
// Both on memstore and on Redis.
func TestBudgetUsageInMoney(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			var base string
			if store == "redis" {
				_, base = newRedisServer(t, redistest.Standalone(t).Addr, "a", WithConfig(mustParse(t, budgetConfig)))
			} else {
				_, ts := newTestServer(t, WithConfig(mustParse(t, budgetConfig)), WithAdminToken(token))
				base = ts.URL
			}
			// Reserve 2 EUR, settle 1.234567 EUR: 1.234567 spent.
			code, d, b := post(t, base+"/v1/reserve", `{"rule":"monthly","key":"k","estimate":2000000}`)
			id, _ := d["reservation"].(string)
			if code != 200 || d["allowed"] != true {
				t.Fatalf("reserve: %d %s", code, b)
			}
			if code, _, b = post(t, base+"/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":1234567}`, id)); code != 200 {
				t.Fatalf("settle: %d %s", code, b)
			}
			resp, body := call(t, "GET", base+"/v1/usage?rule=monthly&key=k", "", bearer(token)...)
			u := decode(t, body)
			if resp.StatusCode != 200 || u["currency"] != "EUR" || u["limit"] != float64(25_000_000) || u["used"] != float64(1_234_567) ||
				u["remaining"] != float64(25_000_000-1_234_567) || u["limit_amount"] != "25" || u["used_amount"] != "1.234567" || u["remaining_amount"] != "23.765433" {
				t.Fatalf("usage: %d %s", resp.StatusCode, body)
			}
			if ms := u["reset_after_ms"].(float64); ms <= 0 || ms > 32*24*3600*1000 {
				t.Errorf("reset_after_ms %v, want the month's end", ms)
			}
			// An override raises one identity's budget, in micro-units.
			if status, d := putOverride(t, base, map[string]any{"rule": "monthly", "key": "k", "limit": "50000000/month"}); status != 200 {
				t.Fatalf("override: %d %v", status, d)
			}
			_, body = call(t, "GET", base+"/v1/usage?rule=monthly&key=k", "", bearer(token)...)
			if u := decode(t, body); u["limit_amount"] != "50" || u["used_amount"] != "1.234567" || u["override"] == nil {
				t.Errorf("overridden budget: %s", body)
			}
			// A rule counting requests has no money fields.
			_, body = call(t, "GET", base+"/v1/usage?rule=api&key=k", "", bearer(token)...)
			if u := decode(t, body); u["currency"] != nil || u["limit_amount"] != nil {
				t.Errorf("a request rule's usage has money: %s", body)
			}
			_, body = call(t, "GET", base+"/v1/rules", "")
			var found bool
			for _, r := range decode(t, body)["rules"].([]any) {
				r := r.(map[string]any)
				if r["name"] == "monthly" {
					found = r["limit"] == "25 EUR/month" && r["currency"] == "EUR" && r["timezone"] == "Europe/Berlin"
				}
			}
			if !found {
				t.Errorf("/v1/rules: %s", body)
			}
		})
	}
}

// TestBudgetTopSpenders: GET /v1/spend lists the identities that settled
// the most under a budget rule, heaviest first, with amounts in money;
// exact while fewer identities than the sketch holds spent.
func TestBudgetTopSpenders(t *testing.T) {
	_, ts := newTestServer(t, WithConfig(mustParse(t, budgetConfig)), WithAdminToken(token))
	base := ts.URL
	spent := map[string]int64{"a": 0, "b": 0, "c": 0}
	for i := range 30 {
		key := []string{"a", "b", "c"}[i%3]
		actual := int64(1000 * (i%3 + 1) * (i + 1))
		_, d, b := post(t, base+"/v1/reserve", `{"rule":"monthly","key":"`+key+`","estimate":200000}`)
		if d["allowed"] != true {
			t.Fatalf("reserve: %s", b)
		}
		if code, _, b := post(t, base+"/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":%d}`, d["reservation"], actual)); code != 200 {
			t.Fatalf("settle: %s", b)
		}
		spent[key] += actual
	}
	resp, body := call(t, "GET", base+"/v1/spend?rule=monthly&n=2", "", bearer(token)...)
	d := decode(t, body)
	top, _ := d["top"].([]any)
	if resp.StatusCode != 200 || d["currency"] != "EUR" || len(top) != 2 {
		t.Fatalf("spend: %d %s", resp.StatusCode, body)
	}
	for i, want := range []string{"c", "b"} {
		e := top[i].(map[string]any)
		if e["identity"] != want || int64(e["count"].(float64)) != spent[want] || e["error"] != float64(0) {
			t.Errorf("top[%d] = %v, want %s with %d", i, e, want, spent[want])
		}
	}
	if e := top[0].(map[string]any); e["amount"] != "0.495" {
		t.Errorf("amount %v, want 0.495 (495,000 micro-units)", e["amount"])
	}
	// Admin only; an unknown rule is named.
	if resp, _ := call(t, "GET", base+"/v1/spend?rule=monthly", ""); resp.StatusCode != 401 {
		t.Errorf("without the token: %d", resp.StatusCode)
	}
	if resp, body := call(t, "GET", base+"/v1/spend?rule=nope", "", bearer(token)...); resp.StatusCode != 404 {
		t.Errorf("unknown rule: %d %s", resp.StatusCode, body)
	}
}

const budgetEventsConfig = `
store: {timeout: 10s}
prices:
  currency: EUR
  models:
    gpt-4o: {input: 2.50, output: 10}
rules:
  - name: monthly
    identity: [header:X-Key]
    budget: 10 EUR/month
    events: true
`

// TestBudgetEventsOnSettle: a budget rule's 80%, 95% and 100% events fire
// on the settle path (each crossing made by a settlement over its
// estimate), exactly once per identity and period, with each identity's
// settlements racing on several goroutines, on memstore and on Redis
// (two instances).
func TestBudgetEventsOnSettle(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			var bases []string
			if store == "redis" {
				addr := redistest.Standalone(t).Addr
				for _, id := range []string{"a", "b"} {
					_, base := newRedisServer(t, addr, id, WithConfig(mustParse(t, budgetEventsConfig)))
					bases = append(bases, base)
				}
			} else {
				_, ts := newTestServer(t, WithConfig(mustParse(t, budgetEventsConfig)), WithAdminToken(token))
				bases = []string{ts.URL}
			}
			// Each identity: reserve 1 micro-unit and settle 8.5 EUR (80%
			// crossed on the settle), then four racing pairs of reserve 1
			// and settle 0.5 EUR: usage is 8.5 EUR + 0.5 EUR per settled
			// pair + 1 per pending reserve, so 95% and 100% are crossed on
			// settles, never on a reserve.
			settle := func(base, key string, est, actual int) {
				code, d, b := post(t, base+"/v1/reserve", fmt.Sprintf(`{"rule":"monthly","key":%q,"estimate":%d}`, key, est))
				id, _ := d["reservation"].(string)
				if code == 429 {
					return // the budget is spent
				}
				if code != 200 || id == "" {
					t.Errorf("reserve %s: %d %s", key, code, b)
					return
				}
				if code, _, b = post(t, base+"/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":%d}`, id, actual)); code != 200 {
					t.Errorf("settle %s: %d %s", key, code, b)
				}
			}
			const ids = 40
			var wg sync.WaitGroup
			for i := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprint("k", i)
					settle(bases[i%len(bases)], key, 1, 8_500_000)
					var inner sync.WaitGroup
					for j := range 4 {
						inner.Add(1)
						go func() {
							defer inner.Done()
							settle(bases[j%len(bases)], key, 1, 500_000)
						}()
					}
					inner.Wait()
				}()
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			counts := map[string]int{}
			since := ""
			for {
				resp, b := call(t, "GET", bases[0]+"/v1/events?limit=1000&since="+since, "", bearer(token)...)
				if resp.StatusCode != 200 {
					t.Fatalf("GET /v1/events: %d %s", resp.StatusCode, b)
				}
				var list struct {
					Events []events.Event
					Next   string
				}
				if err := json.Unmarshal(b, &list); err != nil {
					t.Fatal(err)
				}
				if len(list.Events) == 0 {
					break
				}
				for _, e := range list.Events {
					if e.Kind == events.KindThreshold {
						counts[fmt.Sprint(e.Key, " ", e.Threshold)]++
					}
				}
				since = list.Next
			}
			for i := range ids {
				for _, th := range []float64{0.8, 0.95, 1} {
					if n := counts[fmt.Sprint("k", i, " ", th)]; n != 1 {
						t.Errorf("k%d: %d events at %v, want 1 (all: %v)", i, n, th, counts)
					}
				}
			}
			if len(counts) != ids*3 {
				t.Errorf("%d threshold events, want %d", len(counts), ids*3)
			}
		})
	}
}
