package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
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
	// A applies it at once; B within a second.
	if _, err := a.Policy().Limit("fleetwide", ""); err != nil {
		t.Fatal("not applied on the instance that took the PUT")
	}
	start := time.Now()
	eventually(t, time.Second, "instance b to pick up the rules", func() bool {
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
	if v, err := r.Do("GET", rulesKey); err != nil || !strings.Contains(fmt.Sprint(v), "fleetwide") {
		t.Fatalf("%s: %v %v", rulesKey, v, err)
	}
	// DELETE brings every instance back to its config.
	if resp, _ := call(t, "DELETE", baseB+"/v1/rules", "", bearer(token)...); resp.StatusCode != 200 {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	eventually(t, time.Second, "instance a to restore its config", func() bool {
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
	eventually(t, 2*time.Second, "b's block to be listed on a", func() bool {
		_, body = call(t, "GET", baseA+"/v1/blocked", "", adm...)
		list.Blocked = nil
		return json.Unmarshal(body, &list) == nil && len(list.Blocked) == 1
	})
	if e := list.Blocked[0]; e.Rule != "login" || e.Identity != "192.0.2.66" || list.Source != "redis" {
		t.Fatalf("blocked on a: %s", body)
	}
	// The fleet view on a adds b's counters up and lists both instances.
	eventually(t, 3*time.Second, "the fleet view on a", func() bool {
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
	eventually(t, 2*time.Second, "a to leave b's fleet view", func() bool {
		_, body = call(t, "GET", baseB+"/v1/dashboard/snapshot", "")
		var snap Snapshot
		return json.Unmarshal(body, &snap) == nil && len(snap.Instances) == 1
	})
}

func TestRedisReadiness(t *testing.T) {
	r := redistest.Standalone(t)
	_, base := newRedisServer(t, r.Addr, "a")
	if resp, b := call(t, "GET", base+"/readyz", ""); resp.StatusCode != 200 {
		t.Fatalf("readyz: %d %s", resp.StatusCode, b)
	}
	r.Kill()
	if resp, _ := call(t, "GET", base+"/readyz", ""); resp.StatusCode != 503 {
		t.Fatalf("readyz with Redis down: %d", resp.StatusCode)
	}
	if resp, _ := call(t, "GET", base+"/healthz", ""); resp.StatusCode != 200 {
		t.Fatalf("healthz with Redis down: %d", resp.StatusCode)
	}
	r.Start()
	eventually(t, 10*time.Second, "readyz to recover", func() bool {
		resp, _ := call(t, "GET", base+"/readyz", "")
		return resp.StatusCode == 200
	})
}

func sum(xs []int64) int64 {
	var n int64
	for _, x := range xs {
		n += x
	}
	return n
}
