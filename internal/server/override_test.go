package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
)

// putOverride sends PUT /v1/overrides and returns the status and body.
func putOverride(t *testing.T, base string, body map[string]any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, out := call(t, "PUT", base+"/v1/overrides", string(b), append(bearer(token), "Content-Type", "application/json")...)
	return resp.StatusCode, decode(t, out)
}

// admittedBy checks key under rule until a refusal, returning how many
// were admitted (at most 100).
func admittedBy(t *testing.T, base, rule, key string) int {
	t.Helper()
	for i := range 100 {
		if _, d := check(t, base, rule, key, 1); d["allowed"] != true {
			return i
		}
	}
	return 100
}

func TestOverrideAPI(t *testing.T) {
	_, ts := newTestServer(t, WithAdminToken(token))
	// Bad input: each names its field, and nothing is stored.
	for _, c := range []struct {
		body   map[string]any
		status int
		want   string
	}{
		{map[string]any{"rule": "nope", "key": "k", "limit": "5/m"}, 404, `field rule: no rule is named "nope"`},
		{map[string]any{"key": "k", "limit": "5/m"}, 400, "field rule"},
		{map[string]any{"rule": "api", "key": "k"}, 400, "field limit"},
		{map[string]any{"rule": "api", "key": "k", "limit": "lots"}, 400, "field limit"},
		{map[string]any{"rule": "api", "key": "k", "limit": "5/month"}, 400, "field limit"},
		{map[string]any{"rule": "api", "key": "k", "limit": "-5/m"}, 400, "field limit"},
		{map[string]any{"rule": "api", "key": "a*b*", "limit": "5/m"}, 400, "field key"},
		{map[string]any{"rule": "api", "key": "", "limit": "5/m"}, 400, "field key"},
		{map[string]any{"rule": "api", "key": "k", "limit": "5/m", "until": "2001-01-01T00:00:00Z"}, 400, "field until"},
		{map[string]any{"rule": "api", "key": "k", "limit": "5/m", "until": "tomorrow"}, 400, "field until"},
		{map[string]any{"rule": "api", "key": "k", "limit": "5/m", "note": strings.Repeat("n", 257)}, 400, "field note"},
		{map[string]any{"rule": "api", "key": strings.Repeat("p", 300) + "*", "limit": "5/m"}, 400, "field key"},
		{map[string]any{"rule": "api", "key": "k", "limit": "5/h"}, 400, "field limit"},    // a window keeps its period
		{map[string]any{"rule": "tiered", "key": "k", "limit": "7/m"}, 400, "field limit"}, // gcra: another unit
	} {
		status, d := putOverride(t, ts.URL, c.body)
		if status != c.status || !strings.Contains(fmt.Sprint(d["detail"]), c.want) {
			t.Errorf("PUT %v: %d %v; want %d naming %q", c.body, status, d, c.status, c.want)
		}
	}
	for _, rule := range []string{"api", "tiered"} {
		resp, b := call(t, "GET", ts.URL+"/v1/overrides?rule="+rule, "", bearer(token)...)
		if resp.StatusCode != 200 || len(decode(t, b)["overrides"].([]any)) != 0 {
			t.Fatalf("after bad input: %d %s", resp.StatusCode, b)
		}
	}
	if c := auditChanges(t, ts.URL, ""); len(c) != 0 {
		t.Fatalf("bad input was logged: %v", c)
	}
	// A bucket's override may change its period in the same units:
	// tiered is gcra 2/m; 2/s refills in µs too.
	if status, d := putOverride(t, ts.URL, map[string]any{"rule": "tiered", "key": "k", "limit": "2/s"}); status != 200 || d["limit"] != "2/s" {
		t.Fatalf("PUT 2/s on a 2/m gcra rule: %d %v", status, d)
	}
	call(t, "DELETE", ts.URL+"/v1/overrides?rule=tiered&key=k", "", bearer(token)...)
	var resp *http.Response
	var b []byte
	// The counts below must fall in one minute of the rule's fixed window,
	// which follows the wall clock: start them early in a minute.
	if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < 30*time.Second {
		time.Sleep(left)
	}
	// The rule's 5/m, all used; raised to 8/m: 3 more in the same window.
	if n := admittedBy(t, ts.URL, "api", "k1"); n != 5 {
		t.Fatalf("rule limit: %d admitted", n)
	}
	until := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	status, d := putOverride(t, ts.URL, map[string]any{"rule": "api", "key": "k1", "limit": "8/m", "until": until, "note": "launch"})
	if status != 200 || d["limit"] != "8/m" || d["until"] != until || d["note"] != "launch" || d["key"] != "k1" {
		t.Fatalf("PUT: %d %v", status, d)
	}
	if n := admittedBy(t, ts.URL, "api", "k1"); n != 3 {
		t.Fatalf("raised to 8/m after 5 used: %d admitted, want 3", n)
	}
	resp, b = call(t, "GET", ts.URL+"/v1/usage?rule=api&key=k1", "", bearer(token)...)
	u := decode(t, b)
	if resp.StatusCode != 200 || u["limit"] != 8.0 || u["used"] != 8.0 || u["remaining"] != 0.0 || u["override"] == nil {
		t.Fatalf("usage: %d %s", resp.StatusCode, b)
	}
	// A peek: usage twice leaves the count alone.
	for range 2 {
		_, b = call(t, "GET", ts.URL+"/v1/usage?rule=api&key=k2", "", bearer(token)...)
		if u := decode(t, b); u["used"] != 0.0 || u["limit"] != 5.0 || u["remaining"] != 5.0 || u["override"] != nil {
			t.Fatalf("usage of an unused key: %s", b)
		}
	}
	// A pattern.
	if status, d := putOverride(t, ts.URL, map[string]any{"rule": "api", "key": "team-*", "limit": "7/m"}); status != 200 {
		t.Fatalf("PUT pattern: %d %v", status, d)
	}
	if n := admittedBy(t, ts.URL, "api", "team-9"); n != 7 {
		t.Fatalf("under the pattern: %d admitted, want 7", n)
	}
	resp, b = call(t, "GET", ts.URL+"/v1/overrides?rule=api", "", bearer(token)...)
	if list := decode(t, b)["overrides"].([]any); resp.StatusCode != 200 || len(list) != 2 {
		t.Fatalf("list: %d %s", resp.StatusCode, b)
	}
	// Deleted: the rule's limit again, the count kept.
	resp, b = call(t, "DELETE", ts.URL+"/v1/overrides?rule=api&key=k1", "", bearer(token)...)
	if resp.StatusCode != 200 || decode(t, b)["deleted"] != true {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, b)
	}
	_, b = call(t, "GET", ts.URL+"/v1/usage?rule=api&key=k1", "", bearer(token)...)
	if u := decode(t, b); u["limit"] != 5.0 || u["override"] != nil {
		t.Fatalf("usage after DELETE: %s", b)
	}
	// The admin token guards all of it.
	for _, ep := range []string{"GET /v1/overrides?rule=api", "DELETE /v1/overrides?rule=api&key=k1", "GET /v1/usage?rule=api&key=k1"} {
		m, path, _ := strings.Cut(ep, " ")
		if resp, _ := call(t, m, ts.URL+path, ""); resp.StatusCode != 401 {
			t.Errorf("%s without the token: %d", ep, resp.StatusCode)
		}
	}
}

// TestOverrideRedisTwoInstances: two instances on one Redis, 16
// goroutines on each checking one identity while the limit is raised
// through one of them. Every admission that began after the PUT's
// answer, on either instance, is under the new limit, and the two admit
// exactly the new limit in all. (A denial the other instance's deny
// cache held from before may answer until the invalidation reaches it:
// docs/api.md.)
func TestOverrideRedisTwoInstances(t *testing.T) {
	r := redistest.Standalone(t)
	_, baseA := newRedisServer(t, r.Addr, "a")
	_, baseB := newRedisServer(t, r.Addr, "b")
	var acked atomic.Bool
	var admitted, stale, decided, afterAck atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		base := []string{baseA, baseB}[g%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 8 {
				after := acked.Load()
				d, err := checkFresh(base, "api", "tenant")
				if err != nil {
					t.Error(err)
					return
				}
				decided.Add(1)
				if d["allowed"] == true {
					admitted.Add(1)
				}
				if after {
					afterAck.Add(1)
					if d["allowed"] == true && d["limit"] != 40.0 {
						stale.Add(1)
					}
				}
			}
		}()
	}
	for decided.Load() < 32 {
		time.Sleep(time.Millisecond) // the change lands mid-stream
	}
	status, d := putOverride(t, baseA, map[string]any{"rule": "api", "key": "tenant", "limit": "40/m"})
	acked.Store(true)
	if status != 200 {
		t.Fatalf("PUT: %d %v", status, d)
	}
	wg.Wait()
	more := admittedBy(t, baseB, "api", "tenant")
	if got := admitted.Load() + int64(more); got != 40 {
		t.Fatalf("admitted %d racing the change and %d after: %d in all, want 40", admitted.Load(), more, got)
	}
	t.Logf("%d decisions, %d after the PUT's answer", decided.Load(), afterAck.Load())
	if afterAck.Load() == 0 {
		t.Fatal("no decision came after the change: the race was not run")
	}
	if stale.Load() != 0 {
		t.Fatalf("%d of %d decisions after the PUT's answer admitted under the old limit", stale.Load(), decided.Load())
	}
}

// checkFresh is check for the goroutines of a race, on a connection of
// its own (a reused keep-alive connection the server closed would fail a
// POST that may or may not have been decided), reporting errors instead
// of failing the test from another goroutine.
func checkFresh(base, rule, key string) (map[string]any, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	body, _ := json.Marshal(map[string]any{"rule": rule, "key": key, "hits": 1})
	resp, err := c.Post(base+"/v1/check", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var d map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return nil, fmt.Errorf("POST /v1/check: %d: %w", resp.StatusCode, err)
	}
	return d, nil
}

// auditChanges reads GET /v1/overrides/audit with query q.
func auditChanges(t *testing.T, base, q string) []map[string]any {
	t.Helper()
	resp, b := call(t, "GET", base+"/v1/overrides/audit"+q, "", bearer(token)...)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/overrides/audit%s: %d %s", q, resp.StatusCode, b)
	}
	var out struct{ Changes []map[string]any }
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out.Changes
}

// TestOverrideAudit: every set and delete, and nothing for a refused PUT,
// is read back through GET /v1/overrides/audit, oldest first, with its
// rule and identity; since (a change's id or a time) and limit page it;
// bad parameters are 400 naming them; the admin token guards it.
func TestOverrideAudit(t *testing.T) {
	_, ts := newTestServer(t, WithAdminToken(token))
	if c := auditChanges(t, ts.URL, ""); len(c) != 0 {
		t.Fatalf("before any change: %v", c)
	}
	start := time.Now().UTC().Add(-time.Second).Format(time.RFC3339)
	for _, body := range []map[string]any{
		{"rule": "api", "key": "k1", "limit": "8/m", "note": "launch"},
		{"rule": "api", "key": "k1", "limit": "9/m"},
		{"rule": "api", "key": "team-*", "limit": "7/m"},
		{"rule": "api", "key": "k2", "limit": "5/month"}, // refused
	} {
		putOverride(t, ts.URL, body)
	}
	call(t, "DELETE", ts.URL+"/v1/overrides?rule=api&key=k1", "", bearer(token)...)
	all := auditChanges(t, ts.URL, "")
	want := []string{"set api k1 8/m launch", "set api k1 9/m ", "set api team-* 7/m ", "delete api k1 9/m "}
	if len(all) != len(want) {
		t.Fatalf("audit: %v; want %d changes", all, len(want))
	}
	for i, c := range all {
		if got := fmt.Sprintf("%v %v %v %v %v", c["op"], c["rule"], c["key"], c["limit"], c["note"]); strings.TrimSuffix(got, "<nil>") != want[i] {
			t.Errorf("change %d: %q, want %q", i, got, want[i])
		}
	}
	if c := auditChanges(t, ts.URL, "?limit=2"); len(c) != 2 || c[1]["id"] != all[3]["id"] {
		t.Fatalf("?limit=2: %v; want the latest 2", c)
	}
	if c := auditChanges(t, ts.URL, "?limit=2&since="+all[0]["id"].(string)); len(c) != 2 || c[0]["id"] != all[1]["id"] {
		t.Fatalf("?since=<first id>&limit=2: %v; want the 2nd and 3rd", c)
	}
	if c := auditChanges(t, ts.URL, "?since="+all[3]["id"].(string)); len(c) != 0 {
		t.Fatalf("?since=<last id>: %v", c)
	}
	if c := auditChanges(t, ts.URL, "?since="+start); len(c) != 4 {
		t.Fatalf("?since=%s: %d changes, want 4", start, len(c))
	}
	if c := auditChanges(t, ts.URL, "?since=2100-01-01T00:00:00Z"); len(c) != 0 {
		t.Fatalf("?since= the future: %v", c)
	}
	for q, field := range map[string]string{"?since=yesterday": "since", "?limit=0": "limit", "?limit=1001": "limit", "?limit=x": "limit"} {
		resp, b := call(t, "GET", ts.URL+"/v1/overrides/audit"+q, "", bearer(token)...)
		if resp.StatusCode != 400 || !strings.Contains(string(b), "parameter "+field) {
			t.Errorf("%s: %d %s; want 400 naming %s", q, resp.StatusCode, b, field)
		}
	}
	if resp, _ := call(t, "GET", ts.URL+"/v1/overrides/audit", ""); resp.StatusCode != 401 {
		t.Errorf("without the token: %d", resp.StatusCode)
	}
}
