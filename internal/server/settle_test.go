package server

import (
	"fmt"
	"strings"
	"testing"
)

// TestServeRefusesUnsettledRules: weir serve, whose /v1/auth cannot
// settle a rule after the upstream answers, refuses a count: rule, a
// cost: read from the request and a cost of 0, naming the rule and why,
// from the config and from PUT /v1/rules; a constant cost above 0 is
// taken whole on /v1/auth.
func TestServeRefusesUnsettledRules(t *testing.T) {
	const rule = `
trusted_proxies: [127.0.0.1/32]
rules:
  - name: %s
    match: { methods: [POST], path: /login }
    identity: ip
    limit: 3/15m
    algorithm: fixed_window
    %s
`
	for _, c := range []struct{ name, setting, want string }{
		{"failed-logins", "count: { status: [401, 403] }", `rule "failed-logins": weir serve cannot settle count:`},
		{"tokens", "cost: header:X-Tokens", `rule "tokens": weir serve cannot settle cost: header:X-Tokens`},
		{"by-query", "cost: query:n", `rule "by-query": weir serve cannot settle cost: query:n`},
		{"free", "cost: 0", `rule "free": cost 0 takes nothing on GET /v1/auth`},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := fmt.Sprintf(rule, c.name, c.setting)
			_, err := New(WithConfig(mustParse(t, doc)), WithLogger(quietLogger()))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want an error containing %s", err, c.want)
			}
			const token = "0123456789abcdef-token"
			_, ts := newTestServer(t, WithAdminToken(token))
			resp, b := call(t, "PUT", ts.URL+"/v1/rules", doc[strings.Index(doc, "rules:"):], bearer(token)...)
			if resp.StatusCode != 400 || !strings.Contains(fmt.Sprint(decode(t, b)["detail"]), c.want) {
				t.Fatalf("PUT /v1/rules: %d %s, want 400 containing %s", resp.StatusCode, b, c.want)
			}
		})
	}
	// A constant cost is taken whole: 3/15m at 2 a login admits one.
	_, ts := newTestServer(t, WithConfig(mustParse(t, fmt.Sprintf(rule, "weighted", "cost: 2"))))
	var got []int
	for range 3 {
		code, _ := authCall(t, ts.URL, "X-Original-Method", "POST", "X-Original-URI", "/login", "X-Real-IP", "198.51.100.4")
		got = append(got, code)
	}
	if fmt.Sprint(got) != "[200 403 403]" {
		t.Fatalf("cost: 2 under 3/15m: %v, want [200 403 403]", got)
	}
}
