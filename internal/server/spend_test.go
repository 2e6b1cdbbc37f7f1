package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
)

// settleFor reserves estimate under rule for key and settles actual.
func settleFor(t *testing.T, base, rule, key string, actual int64) {
	t.Helper()
	_, d, b := post(t, base+"/v1/reserve", fmt.Sprintf(`{"rule":%q,"key":%q,"estimate":200000}`, rule, key))
	if d["allowed"] != true {
		t.Fatalf("reserve: %s", b)
	}
	if code, _, b := post(t, base+"/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":%d}`, d["reservation"], actual)); code != 200 {
		t.Fatalf("settle: %s", b)
	}
}

// spendOf returns GET /v1/spend's answer and its top as identity → entry.
func spendOf(t *testing.T, base, rule string, n int) (map[string]any, map[string]map[string]any, []string) {
	t.Helper()
	resp, body := call(t, "GET", fmt.Sprintf("%s/v1/spend?rule=%s&n=%d", base, rule, n), "", bearer(token)...)
	if resp.StatusCode != 200 {
		t.Fatalf("spend: %d %s", resp.StatusCode, body)
	}
	d := decode(t, body)
	m := map[string]map[string]any{}
	var order []string
	for _, e := range d["top"].([]any) {
		e := e.(map[string]any)
		m[e["identity"].(string)] = e
		order = append(order, e["identity"].(string))
	}
	return d, m, order
}

// TestSpendPerPeriod: GET /v1/spend ranks the rule's current calendar
// period in its zone: at the start of the next month (Berlin) the
// ranking starts afresh, and the answer names the period.
func TestSpendPerPeriod(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 11, 30, 22, 59, 0, 0, time.UTC).UnixNano()) // 23:59 in Berlin
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	_, ts := newTestServer(t, WithConfig(mustParse(t, budgetConfig)), WithAdminToken(token), withClock(clock))
	settleFor(t, ts.URL, "monthly", "a", 70_000)
	d, top, _ := spendOf(t, ts.URL, "monthly", 10)
	per := d["period"].(map[string]any)
	if per["start"] != "2026-11-01T00:00:00+01:00" || per["end"] != "2026-12-01T00:00:00+01:00" || d["scope"] != "instance" ||
		top["a"] == nil || top["a"]["count"] != float64(70_000) {
		t.Fatalf("November: %v", d)
	}
	now.Store(time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC).UnixNano()) // Berlin's 1 December
	d, top, _ = spendOf(t, ts.URL, "monthly", 10)
	if per := d["period"].(map[string]any); per["start"] != "2026-12-01T00:00:00+01:00" || len(top) != 0 {
		t.Fatalf("December: %v", d)
	}
	settleFor(t, ts.URL, "monthly", "b", 5)
	if _, top, _ = spendOf(t, ts.URL, "monthly", 10); len(top) != 1 || top["b"]["count"] != float64(5) {
		t.Fatalf("December after a settlement: %v", top)
	}
	// A fixed window's period is aligned to the epoch.
	d, _, _ = spendOf(t, ts.URL, "api", 10)
	if per := d["period"].(map[string]any); per["start"] != "2026-11-30T23:00:00Z" || per["end"] != "2026-11-30T23:01:00Z" {
		t.Errorf("api's period: %v", per)
	}
}

// TestSpendFleetWide: on Redis, GET /v1/spend adds up every instance's
// settlements of the period: an instance's own at once, another's once
// that one has flushed (every second, and on shutdown), each micro-unit
// once. The sorted set expires at the period's end.
func TestSpendFleetWide(t *testing.T) {
	r := redistest.Standalone(t)
	cfg := WithConfig(mustParse(t, budgetConfig))
	slow := func(o *options) { o.spendEvery = time.Hour } // flushed by hand below
	a, baseA := newRedisServer(t, r.Addr, "a", cfg, slow)
	b, baseB := newRedisServer(t, r.Addr, "b", cfg, slow)
	want := map[string]int64{}
	for i := range 40 {
		key := "k" + strconv.Itoa(i%5)
		base := baseA
		if i%2 == 1 {
			base = baseB
		}
		settleFor(t, base, "monthly", key, int64(1000*(i+1)))
		want[key] += int64(1000 * (i + 1))
	}
	// A sees its own settlements, not B's yet.
	d, top, _ := spendOf(t, baseA, "monthly", 10)
	if d["scope"] != "fleet" {
		t.Fatalf("before the flush: %v", d)
	}
	var own int64
	for _, e := range top {
		own += int64(e["count"].(float64))
	}
	if own != 20*20*1000 { // 1000 × (1+3+…+39)
		t.Fatalf("A's own settlements before a flush: %d, want %d (%v)", own, 20*20*1000, top)
	}
	ctx := context.Background()
	for round := range 2 { // B flushes, then A: the same sums, counted once
		srv := []*Server{b, a}[round]
		if err := srv.flushSpend(ctx); err != nil {
			t.Fatal(err)
		}
		// After B's flush A sees everything (B's in Redis, its own
		// unflushed); after A's, B does too.
		for _, base := range []string{baseA, baseB}[:round+1] {
			_, top, order := spendOf(t, base, "monthly", 10)
			if len(top) != 5 {
				t.Fatalf("round %d: %v", round, top)
			}
			for k, w := range want {
				if top[k]["count"] != float64(w) || top[k]["error"] != float64(0) {
					t.Errorf("round %d, %s: %v, want %d", round, k, top[k], w)
				}
			}
			if order[0] != "k4" {
				t.Errorf("heaviest first: %v", order)
			}
		}
	}
	// The set expires at the period's end.
	per, err := a.spendPeriod(a.Policy(), "monthly")
	if err != nil {
		t.Fatal(err)
	}
	z, h := a.spendKeys("monthly", per.start)
	for _, k := range []string{z, h} {
		v, err := r.Do("PEXPIRETIME", k)
		if k == h && v == int64(-2) { // no errors, no hash
			continue
		}
		if err != nil || v != per.end/1000 {
			t.Errorf("PEXPIRETIME %s = %v %v, want %d", k, v, err, per.end/1000)
		}
	}
	// Shutdown flushes: B's next settlement reaches A when B closes.
	settleFor(t, baseB, "monthly", "k9", 777)
	if _, top, _ := spendOf(t, baseA, "monthly", 64); top["k9"] != nil {
		t.Fatalf("unflushed settlement seen elsewhere: %v", top["k9"])
	}
	b.Close()
	if _, top, _ := spendOf(t, baseA, "monthly", 64); top["k9"] == nil || top["k9"]["count"] != float64(777) {
		t.Fatalf("after B's shutdown: %v", top["k9"])
	}
}

// TestSpendCapped: the fleet's sorted set keeps at most spendCap
// identities; past that the lowest gives its place, and every listed
// count stays within its error of the true sum (space-saving), across
// flushes from two instances.
func TestSpendCapped(t *testing.T) {
	r := redistest.Standalone(t)
	cfg := WithConfig(mustParse(t, budgetConfig))
	slow := func(o *options) { o.spendEvery = time.Hour }
	a, baseA := newRedisServer(t, r.Addr, "a", cfg, slow)
	b, _ := newRedisServer(t, r.Addr, "b", cfg, slow)
	per, err := a.spendPeriod(a.Policy(), "monthly")
	if err != nil {
		t.Fatal(err)
	}
	truth := map[string]int64{}
	ctx := context.Background()
	for round := range 3 {
		for i := range spendCap + 300 {
			id := "id" + strconv.Itoa((i*7+round*131)%(spendCap+500))
			w := int64(1 + i%17)
			if i%50 == 0 {
				id, w = "whale", 1_000_000
			}
			srv := []*Server{a, b}[i%2]
			srv.spend.add("monthly", id, per, w, 0)
			truth[id] += w
		}
		for _, srv := range []*Server{a, b} {
			if err := srv.flushSpend(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	z, _ := a.spendKeys("monthly", per.start)
	if n, err := r.Do("ZCARD", z); err != nil || n != int64(spendCap) {
		t.Fatalf("ZCARD = %v %v, want %d", n, err, spendCap)
	}
	_, top, order := spendOf(t, baseA, "monthly", 64)
	if order[0] != "whale" || top["whale"]["count"] != float64(truth["whale"]) {
		t.Errorf("whale: %v, want %d", top["whale"], truth["whale"])
	}
	for id, e := range top {
		c, er := int64(e["count"].(float64)), int64(e["error"].(float64))
		if c < truth[id] || c-er > truth[id] {
			t.Errorf("%s: count %d error %d, true %d", id, c, er, truth[id])
		}
	}
	// Every member of the set, not only the top: within its error.
	all, err := a.spendTop(ctx, "monthly", per, spendCap)
	if err != nil || len(all) != spendCap {
		t.Fatalf("the whole set: %d members, %v", len(all), err)
	}
	var uncertain int
	for _, e := range all {
		if e.Count < truth[e.Identity] || e.Count-e.Error > truth[e.Identity] {
			t.Fatalf("%s: count %d error %d, true %d", e.Identity, e.Count, e.Error, truth[e.Identity])
		}
		if e.Error > 0 {
			uncertain++
		}
	}
	if uncertain == 0 {
		t.Fatal("no member took a place given up: the test did not pass the cap")
	}
}

// TestSpendFleetWideCluster: on Redis Cluster each rule's sorted set and
// error hash share a slot (one hash tag), so the flush script runs there;
// two instances' settlements of several rules add up exactly.
func TestSpendFleetWideCluster(t *testing.T) {
	c := redistest.Cluster(t)
	cfg := WithConfig(mustParse(t, budgetConfig+`  - {name: weekly, identity: [header:X-Key], budget: 5 EUR/week}
  - {name: daily, identity: [header:X-Key], budget: 1 EUR/day, timezone: Asia/Tokyo}
`))
	slow := func(o *options) { o.spendEvery = time.Hour }
	url := WithRedisURL(strings.Join(c.Addrs, ","))
	a, baseA := newRedisServer(t, "", "a", cfg, slow, url)
	b, baseB := newRedisServer(t, "", "b", cfg, slow, url)
	rules := []string{"monthly", "weekly", "daily"}
	want := map[string]map[string]int64{}
	for i := range 30 {
		rule, key := rules[i%3], "k"+strconv.Itoa(i%4)
		if want[rule] == nil {
			want[rule] = map[string]int64{}
		}
		settleFor(t, []string{baseA, baseB}[i%2], rule, key, int64(100*(i+1)))
		want[rule][key] += int64(100 * (i + 1))
	}
	for _, srv := range []*Server{a, b} {
		if err := srv.flushSpend(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for _, rule := range rules {
		_, top, _ := spendOf(t, baseB, rule, 10)
		if len(top) != len(want[rule]) {
			t.Fatalf("%s: %v, want %v", rule, top, want[rule])
		}
		for k, w := range want[rule] {
			if top[k]["count"] != float64(w) {
				t.Errorf("%s %s: %v, want %d", rule, k, top[k], w)
			}
		}
	}
}

// TestSpendFlushCountsOnce: settlements added while flushes run back to
// back are each counted once in the fleet's set: none twice (a flush takes
// what it sends out of the book), none lost.
func TestSpendFlushCountsOnce(t *testing.T) {
	r := redistest.Standalone(t)
	slow := func(o *options) { o.spendEvery = time.Hour }
	a, _ := newRedisServer(t, r.Addr, "a", WithConfig(mustParse(t, budgetConfig)), slow)
	per, err := a.spendPeriod(a.Policy(), "monthly")
	if err != nil {
		t.Fatal(err)
	}
	const adders, each = 8, 2000
	stop, done := make(chan struct{}), make(chan struct{})
	var flushes int
	go func() {
		defer close(done)
		for ctx := context.Background(); ; flushes++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := a.flushSpend(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range adders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				a.spend.add("monthly", "k"+strconv.Itoa((g+i)%7), per, 1, 0)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-done
	if err := a.flushSpend(context.Background()); err != nil {
		t.Fatal(err)
	}
	all, err := a.spendTop(context.Background(), "monthly", per, spendCap)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, e := range all {
		sum += e.Count
	}
	if sum != adders*each {
		t.Fatalf("the set holds %d, want %d (%d flushes ran)", sum, adders*each, flushes)
	}
}
