package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/redisstore"
)

// newRedisServer builds a Server on the Redis at addr and serves it.
func newRedisServer(t *testing.T, addr, id string, opts ...Option) (*Server, string) {
	t.Helper()
	all := append([]Option{
		WithConfig(mustParse(t, testConfig+"store:\n  timeout: 2s\n")), WithRedisURL("redis://" + addr), WithInstanceID(id),
		WithAdminToken(token), WithLogger(quietLogger()), withFastLoops(),
	}, opts...)
	s, err := New(all...)
	if err != nil {
		t.Fatalf("New on Redis: %v", err)
	}
	base, _ := serveOn(t, s)
	return s, base
}

func TestRedisRulesReachEveryInstance(t *testing.T) {
	r := redistest.Standalone(t)
	a, baseA := newRedisServer(t, r.Addr, "a")
	b, baseB := newRedisServer(t, r.Addr, "b")
	if a.StoreDescription() != "redis standalone "+r.Addr+" (scripts as functions)" {
		t.Fatalf("store: %s", a.StoreDescription())
	}
	newRules := "rules:\n  - name: fleetwide\n    limit: 3/m\n    algorithm: sliding_log\n"
	resp, body := call(t, "PUT", baseA+"/v1/rules", newRules, bearer(token)...)
	if resp.StatusCode != 200 || decode(t, body)["scope"] != "fleet" {
		t.Fatalf("PUT: %d %s", resp.StatusCode, body)
	}
	// A applies it at once; B when it next polls the stored rules.
	if _, err := a.Policy().Limit("fleetwide", ""); err != nil {
		t.Fatal("not applied on the instance that took the PUT")
	}
	start := time.Now()
	eventually(t, 30*time.Second, "instance b to pick up the rules", func() bool {
		_, err := b.Policy().Limit("fleetwide", "")
		return err == nil
	})
	t.Logf("instance b picked the rules up after %v", time.Since(start).Round(time.Millisecond))
	// The two instances share the limit.
	allowed := 0
	for i := range 6 {
		base := []string{baseA, baseB}[i%2]
		if _, d := check(t, base, "fleetwide", "k", 1); d["allowed"] == true {
			allowed++
		}
	}
	if allowed != 3 {
		t.Fatalf("%d of 6 allowed across two instances under 3/m", allowed)
	}
	// A third instance started later finds the stored rules.
	c, _ := newRedisServer(t, r.Addr, "c")
	if _, err := c.Policy().Limit("fleetwide", ""); err != nil {
		t.Fatal("a new instance did not load the rules stored in Redis")
	}
	if v, err := r.Do("GET", keysFor("").rules); err != nil || !strings.Contains(fmt.Sprint(v), "fleetwide") {
		t.Fatalf("%s: %v %v", keysFor("").rules, v, err)
	}
	// DELETE brings every instance back to its config.
	if resp, _ := call(t, "DELETE", baseB+"/v1/rules", "", bearer(token)...); resp.StatusCode != 200 {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	eventually(t, 30*time.Second, "instance a to restore its config", func() bool {
		_, err := a.Policy().Limit("login", "")
		return err == nil
	})
}

func TestRedisFleetViewAndPenaltyBox(t *testing.T) {
	r := redistest.Standalone(t)
	a, baseA := newRedisServer(t, r.Addr, "a")
	_, baseB := newRedisServer(t, r.Addr, "b")
	// Traffic on both: b blocks an identity.
	for range 2 {
		check(t, baseA, "api", "ka", 1)
	}
	for range 5 {
		check(t, baseB, "login", "192.0.2.66", 1)
	}
	adm := bearer(token)
	// a lists b's block: the index is in Redis.
	_, body := call(t, "GET", baseA+"/v1/blocked", "", adm...)
	var list struct {
		Blocked []BlockedEntry `json:"blocked"`
		Source  string         `json:"source"`
	}
	eventually(t, 30*time.Second, "b's block to be listed on a", func() bool {
		_, body = call(t, "GET", baseA+"/v1/blocked", "", adm...)
		list.Blocked = nil
		return json.Unmarshal(body, &list) == nil && len(list.Blocked) == 1
	})
	if e := list.Blocked[0]; e.Rule != "login" || e.Identity != "192.0.2.66" || list.Source != "redis" {
		t.Fatalf("blocked on a: %s", body)
	}
	// The fleet view on a adds b's counters up and lists both instances.
	eventually(t, 30*time.Second, "the fleet view on a", func() bool {
		_, body = call(t, "GET", baseA+"/v1/dashboard/snapshot", "")
		var snap Snapshot
		if json.Unmarshal(body, &snap) != nil || len(snap.Instances) != 2 {
			return false
		}
		login := snap.Series.Rules["login"]
		api := snap.Series.Rules["api"]
		if login == nil || api == nil {
			return false
		}
		return sum(login.Allowed) == 3 && sum(login.Limited) == 2 && sum(api.Allowed) == 2 &&
			len(snap.Blocked) == 1 && len(snap.Top["login"]) == 1 && snap.Top["login"][0].Count == 2
	})
	// Unblocking on a removes it from the fleet list and from b's.
	if resp, _ := call(t, "DELETE", baseA+"/v1/blocked?rule=login&key=192.0.2.66", "", adm...); resp.StatusCode != 200 {
		t.Fatalf("unblock: %d", resp.StatusCode)
	}
	_, body = call(t, "GET", baseB+"/v1/blocked", "", adm...)
	if strings.Contains(string(body), "192.0.2.66") {
		t.Fatalf("still blocked on b: %s", body)
	}
	if _, d := check(t, baseB, "login", "192.0.2.66", 1); d["allowed"] != true {
		t.Fatalf("not admitted after unblock: %v", d)
	}
	// An instance that shuts down leaves the list at once.
	a.Close()
	_, body = call(t, "GET", baseB+"/v1/dashboard/snapshot", "")
	eventually(t, 30*time.Second, "a to leave b's fleet view", func() bool {
		_, body = call(t, "GET", baseB+"/v1/dashboard/snapshot", "")
		var snap Snapshot
		return json.Unmarshal(body, &snap) == nil && len(snap.Instances) == 1
	})
}

// TestRedisReadiness: a Redis outage leaves the instance ready (it answers,
// by on_error) while /healthz/store and weir_store_up say the store is
// down, and both recover with Redis.
func TestRedisReadiness(t *testing.T) {
	r := redistest.Standalone(t)
	_, base := newRedisServer(t, r.Addr, "a")
	if resp, b := call(t, "GET", base+"/healthz/store", ""); resp.StatusCode != 200 {
		t.Fatalf("healthz/store: %d %s", resp.StatusCode, b)
	}
	r.Kill()
	for _, p := range []string{"/readyz", "/healthz"} {
		if resp, b := call(t, "GET", base+p, ""); resp.StatusCode != 200 {
			t.Fatalf("%s with Redis down: %d %s", p, resp.StatusCode, b)
		}
	}
	if resp, b := call(t, "GET", base+"/healthz/store", ""); resp.StatusCode != 503 {
		t.Fatalf("healthz/store with Redis down: %d %s", resp.StatusCode, b)
	}
	if _, m := call(t, "GET", base+"/metrics", ""); !strings.Contains(string(m), "\nweir_store_up 0\n") {
		t.Fatal("weir_store_up is not 0 with Redis down")
	}
	r.Start()
	eventually(t, 10*time.Second, "healthz/store to recover", func() bool {
		resp, _ := call(t, "GET", base+"/healthz/store", "")
		return resp.StatusCode == 200
	})
	if _, m := call(t, "GET", base+"/metrics", ""); !strings.Contains(string(m), "\nweir_store_up 1\n") {
		t.Fatal("weir_store_up is not 1 with Redis back")
	}
}

func sum(xs []int64) int64 {
	var n int64
	for _, x := range xs {
		n += x
	}
	return n
}

// TestRedisStoreOfTheCaller: a redisstore.Store given with WithStore, here
// built on the caller's own rueidis client, serves the limiter and lends
// the service its client for the service's own keys: the rules a PUT
// stores land in that Redis, and the dashboard names the Redis and how it
// runs its scripts. Closing the server leaves the store, and the client,
// to the caller.
func TestRedisStoreOfTheCaller(t *testing.T) {
	r := redistest.Standalone(t)
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rs, err := redisstore.NewWithClient(ctx, c, redisstore.Config{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	s, err := New(WithConfig(mustParse(t, testConfig+"store:\n  timeout: 2s\n")), WithRedisStore(rs), WithInstanceID("a"),
		WithAdminToken(token), WithLogger(quietLogger()), withFastLoops())
	if err != nil {
		t.Fatal(err)
	}
	base, stop := serveOn(t, s)
	if got, want := s.StoreDescription(), "redis standalone "+r.Addr+" (scripts as functions)"; got != want {
		t.Fatalf("store: %q, want %q", got, want)
	}
	if _, d := check(t, base, "login", "192.0.2.1", 1); d["allowed"] != true {
		t.Fatalf("check: %v", d)
	}
	newRules := "rules:\n  - name: fleetwide\n    limit: 3/m\n"
	if resp, body := call(t, "PUT", base+"/v1/rules", newRules, bearer(token)...); resp.StatusCode != 200 || decode(t, body)["scope"] != "fleet" {
		t.Fatalf("PUT: %d %s", resp.StatusCode, body)
	}
	if v, err := r.Do("GET", keysFor("").rules); err != nil || !strings.Contains(fmt.Sprint(v), "fleetwide") {
		t.Fatalf("%s: %v %v", keysFor("").rules, v, err)
	}
	stop()
	s.Close()
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 1, Period: time.Minute}
	if res, err := rs.Take(ctx, "after", l, 1); err != nil || !res.Allowed {
		t.Fatalf("the caller's store after the server closed: %+v, %v", res, err)
	}
}
