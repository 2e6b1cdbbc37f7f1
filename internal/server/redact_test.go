package server

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

var tagRE = regexp.MustCompile(`^#[0-9a-f]{16}$`)

// readOnlyView is what the tests read from /v1/dashboard/snapshot.
type readOnlyView struct {
	Identities string                `json:"identities"`
	Top        map[string][]TopEntry `json:"top"`
	Blocked    []BlockedEntry        `json:"blocked"`
}

// TestReadOnlyEndpointsRedactIdentities: without the admin token the
// dashboard snapshot and /v1/top show tags instead of identities, the same
// tag for the same identity; with it they show everything.
func TestReadOnlyEndpointsRedactIdentities(t *testing.T) {
	const secretKey = "sk_live_9b7e1f0c2d"
	const ip = "192.0.2.55"
	s, ts := newTestServer(t, WithAdminToken(token))
	for range 5 {
		check(t, ts.URL, "login", ip, 1) // 3/m, block 1m: in the penalty box
	}
	for range 7 {
		check(t, ts.URL, "api", secretKey, 1) // 5/m
	}
	snapshot := func(header ...string) (readOnlyView, string) {
		t.Helper()
		resp, b := call(t, "GET", ts.URL+"/v1/dashboard/snapshot", "", header...)
		if resp.StatusCode != 200 {
			t.Fatalf("snapshot: %d %s", resp.StatusCode, b)
		}
		var v readOnlyView
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		return v, string(b)
	}

	v, body := snapshot()
	if strings.Contains(body, ip) || strings.Contains(body, secretKey) {
		t.Fatalf("the snapshot without a token reveals an identity:\n%s", body)
	}
	if v.Identities != "redacted" || len(v.Blocked) != 1 || len(v.Top["login"]) != 1 || len(v.Top["api"]) != 1 {
		t.Fatalf("redacted snapshot: %+v", v)
	}
	tag := v.Blocked[0].Identity
	if !tagRE.MatchString(tag) || v.Top["login"][0].Identity != tag || v.Top["login"][0].Count != 2 {
		t.Fatalf("blocked %q and top %+v: want one tag #<16 hex> for one identity", tag, v.Top["login"])
	}
	if v.Blocked[0].Rule != "login" || v.Blocked[0].BlockedUntilMS == 0 {
		t.Fatalf("blocked entry: %+v", v.Blocked[0])
	}

	resp, b := call(t, "GET", ts.URL+"/v1/top", "")
	if resp.StatusCode != 200 || strings.Contains(string(b), ip) || strings.Contains(string(b), secretKey) ||
		!strings.Contains(string(b), `"identity":"`+tag+`"`) || !strings.Contains(string(b), `"identities":"redacted"`) {
		t.Fatalf("/v1/top without a token: %d %s", resp.StatusCode, b)
	}

	// With the token, everything.
	v, body = snapshot(bearer(token)...)
	if v.Identities != "full" || v.Blocked[0].Identity != ip || v.Top["api"][0].Identity != secretKey {
		t.Fatalf("snapshot with the token: %s", body)
	}
	resp, b = call(t, "GET", ts.URL+"/v1/top?rule=api", "", bearer(token)...)
	if resp.StatusCode != 200 || !strings.Contains(string(b), secretKey) {
		t.Fatalf("/v1/top with the token: %d %s", resp.StatusCode, b)
	}
	// Another scheme (a proxy's Basic credentials) is no token: redacted.
	if resp, b := call(t, "GET", ts.URL+"/v1/dashboard/snapshot", "", "Authorization", "Basic dXNlcjpwYXNz"); resp.StatusCode != 200 ||
		strings.Contains(string(b), ip) || !strings.Contains(string(b), `"identities":"redacted"`) {
		t.Fatalf("snapshot with Basic credentials: %d %.200s", resp.StatusCode, b)
	}
	// A wrong token is refused, not quietly redacted.
	for _, p := range []string{"/v1/dashboard/snapshot", "/v1/top"} {
		if resp, b := call(t, "GET", ts.URL+p, "", bearer("wrong")...); resp.StatusCode != 401 {
			t.Fatalf("%s with a wrong token: %d %s", p, resp.StatusCode, b)
		}
	}

	// The tag is keyed per process: another instance tags the same
	// identity differently, so a tag cannot be matched against a hash of a
	// guessed address.
	if other := newRedactor().tag(ip); other == s.redact.tag(ip) {
		t.Fatalf("two processes gave %s the same tag %s", ip, other)
	}

	// With the admin API off, identities stay hidden, token or not.
	_, ts2 := newTestServer(t)
	for range 5 {
		check(t, ts2.URL, "login", ip, 1)
	}
	for _, h := range [][]string{nil, bearer(token)} {
		resp, b := call(t, "GET", ts2.URL+"/v1/dashboard/snapshot", "", h...)
		if resp.StatusCode != 200 || strings.Contains(string(b), ip) || !strings.Contains(string(b), `"identities":"redacted"`) {
			t.Fatalf("snapshot with the admin API off (header %v): %d %s", h, resp.StatusCode, b)
		}
	}
}
