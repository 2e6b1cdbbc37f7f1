package policy

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
)

var ctx = context.Background()

func TestMatch(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: login, match: {methods: [POST], path: /api/login}, identity: const:x, limit: 1000/m}
  - {name: api, match: {path: /api/}, identity: const:x, limit: 1000/m}
  - {name: users, match: {path: "/users/{id}"}, identity: const:x, limit: 1000/m}
  - {name: files, match: {path: "/files/{rest...}"}, identity: const:x, limit: 1000/m}
  - {name: root, match: {path: "/{$}"}, identity: const:x, limit: 1000/m}
  - {name: host, match: {host: api.example.com}, identity: const:x, limit: 1000/m}
  - {name: wild, match: {host: "*.example.org"}, identity: const:x, limit: 1000/m}
  - {name: get, match: {methods: [get], path: /g}, identity: const:x, limit: 1000/m}
`, nil)
	for _, c := range []struct {
		method, target string
		host           string
		want           []string
	}{
		{"POST", "/api/login", "", []string{"login", "api"}},
		{"GET", "/api/login", "", []string{"api"}},
		{"POST", "/api//login", "", []string{"login", "api"}}, // an unclean path cannot dodge a rule
		{"POST", "/api/./login", "", []string{"login", "api"}},
		{"GET", "/api", "", []string{"api"}}, // ServeMux would redirect it to /api/
		{"GET", "/apix", "", nil},
		{"GET", "/users/42", "", []string{"users"}},
		{"GET", "/users/42/posts", "", nil},
		{"GET", "/files/a/b/c.txt", "", []string{"files"}},
		{"GET", "/", "", []string{"root"}},
		{"GET", "/other", "", nil},
		{"GET", "/x", "API.example.com:8443", []string{"host"}},
		{"GET", "/x", "api.example.com.", []string{"host"}},
		{"GET", "/x", "a.b.example.org", []string{"wild"}},
		{"GET", "/x", "example.org", nil},
		{"GET", "/g", "", []string{"get"}},
		{"HEAD", "/g", "", []string{"get"}}, // GET covers HEAD, as in ServeMux
		{"PUT", "/g", "", nil},
	} {
		r := req(c.method, c.target)
		if c.host != "" {
			r.Host = c.host
		} else {
			r.Host = "other.test"
		}
		if got := names(p.Check(ctx, r)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s %s (host %s): matched %v, want %v", c.method, c.target, r.Host, got, c.want)
		}
	}
}

// TestRouteIdentity checks that route counts by the pattern, so that keys
// stay bounded however many URLs there are.
func TestRouteIdentity(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: users, match: {path: "/users/{id}"}, identity: [route], limit: 3/m}
`, nil)
	for i, u := range []string{"/users/1", "/users/2", "/users/3", "/users/4"} {
		v := p.Check(ctx, req("GET", u))
		rr := v.Results[0]
		if rr.Identity != "/users/{id}" || rr.Key != weir.Key("users", "/users/{id}") {
			t.Fatalf("%s: identity %q key %q", u, rr.Identity, rr.Key)
		}
		if v.Allowed != (i < 3) {
			t.Fatalf("%s: allowed %v", u, v.Allowed)
		}
	}
}

func TestIdentities(t *testing.T) {
	v6 := "[2001:db8:1:2:3:4:5:6]:443"
	for _, c := range []struct {
		identity string
		r        *http.Request
		want     string // "" = missing
	}{
		{"ip", req("GET", "/"), "192.0.2.1"},
		{"ip", from(req("GET", "/", "X-Forwarded-For", "203.0.113.9"), "192.0.2.1:1"), "192.0.2.1"}, // no trusted proxies: XFF ignored
		{"ip/24", from(req("GET", "/"), "198.51.100.77:1"), "198.51.100.0/24"},
		{"ip", from(req("GET", "/"), v6), "2001:db8:1:2::/64"},
		{"ip/24", from(req("GET", "/"), v6), "2001:db8:1:2::/64"},
		{"ip/128", from(req("GET", "/"), v6), "2001:db8:1:2:3:4:5:6"},
		{"ip/32/128", from(req("GET", "/"), v6), "2001:db8:1:2:3:4:5:6"},
		{"ip/64", from(req("GET", "/"), v6), "2001:db8:1:2::/64"},
		{"ip/64", from(req("GET", "/"), "198.51.100.77:1"), "198.51.100.77"},
		{"ip/16/48", from(req("GET", "/"), "198.51.100.77:1"), "198.51.0.0/16"},
		{"ip/16/48", from(req("GET", "/"), v6), "2001:db8:1::/48"},
		{"ip", from(req("GET", "/"), "[::ffff:198.51.100.77]:1"), "198.51.100.77"},
		{"ip", from(req("GET", "/"), "@"), ""},
		{"header:x-api-key", req("GET", "/", "X-Api-Key", "k1"), "k1"},
		{"header:X-API-Key", req("GET", "/", "X-API-Key", "  "), ""},
		{"header:X-API-Key", req("GET", "/"), ""},
		{"cookie:session", req("GET", "/", "Cookie", "a=1; session=s42"), "s42"},
		{"cookie:session", req("GET", "/", "Cookie", "a=1"), ""},
		{"query:api_key", req("GET", "/?api_key=q1&x=2"), "q1"},
		{"query:api_key", req("GET", "/?x=2"), ""},
		{"method", req("DELETE", "/"), "DELETE"},
		{"const:all", req("GET", "/"), "all"},
	} {
		p := mustPolicy(t, "rules:\n  - {name: r, identity: \""+c.identity+"\", limit: 100/m}\n", nil)
		v := p.Check(ctx, c.r)
		rr := v.Results[0]
		if c.want == "" {
			if !rr.Skipped || rr.Identity != "" || rr.Key != "" {
				t.Errorf("%s: %+v, want skipped", c.identity, rr)
			}
			continue
		}
		if rr.Skipped || rr.Identity != c.want || rr.Key != weir.Key("r", c.want) || !rr.Result.Allowed {
			t.Errorf("%s: identity %q key %q skipped %v, want %q", c.identity, rr.Identity, rr.Key, rr.Skipped, c.want)
		}
	}
}

// TestCompositeIdentity checks composite keys: every part counts, the
// parts are escaped, and a missing part is a missing identity.
func TestCompositeIdentity(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: promo, identity: [header:X-Member, query:promo], limit: 1/h}
`, nil)
	v := p.Check(ctx, req("GET", "/?promo=P1", "X-Member", "m:1"))
	if rr := v.Results[0]; rr.Identity != "m%3A1:P1" || rr.Key != weir.Key("promo", "m%3A1:P1") || !v.Allowed {
		t.Fatalf("%+v", rr)
	}
	if v := p.Check(ctx, req("GET", "/?promo=P1", "X-Member", "m:1")); v.Allowed {
		t.Fatal("same member and promo admitted twice")
	}
	if v := p.Check(ctx, req("GET", "/?promo=P2", "X-Member", "m:1")); !v.Allowed {
		t.Fatal("another promo for the same member was rejected")
	}
	if v := p.Check(ctx, req("GET", "/?promo=P1", "X-Member", "m:2")); !v.Allowed {
		t.Fatal("another member with the same promo was rejected")
	}
	// A value that contains the separator cannot reach another pair's bucket.
	if v := p.Check(ctx, req("GET", "/?promo=1:P1", "X-Member", "m")); !v.Allowed {
		t.Fatal("m + 1:P1 shared a bucket with m:1 + P1")
	}
	if v := p.Check(ctx, req("GET", "/", "X-Member", "m:1")); !v.Results[0].Skipped || !v.Allowed {
		t.Fatalf("a missing part did not skip: %+v", v)
	}
	// CheckKey reaches the same state with RuleResult.Identity.
	rr, err := p.CheckKey(ctx, KeyRequest{Rule: "promo", Key: "m%3A1:P1", N: 0})
	if err != nil || rr.Result.Allowed || rr.Key != weir.Key("promo", "m%3A1:P1") {
		t.Fatalf("CheckKey peek: %+v, %v", rr, err)
	}
}

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("fd00::/8")}
	for _, c := range []struct {
		name    string
		trusted []netip.Prefix
		remote  string
		xff     []string
		realIP  string
		want    string
	}{
		{"no proxies: peer", nil, "198.51.100.1:5", []string{"1.1.1.1"}, "2.2.2.2", "198.51.100.1"},
		{"untrusted peer: headers ignored", trusted, "198.51.100.1:5", []string{"1.1.1.1"}, "", "198.51.100.1"},
		{"trusted peer, one hop", trusted, "10.0.0.2:5", []string{"203.0.113.5"}, "", "203.0.113.5"},
		{"spoofed left entries are skipped", trusted, "10.0.0.2:5", []string{"6.6.6.6, 203.0.113.5, 10.0.0.9"}, "", "203.0.113.5"},
		{"several XFF headers", trusted, "127.0.0.1:5", []string{"6.6.6.6", "203.0.113.5, 10.1.1.1"}, "", "203.0.113.5"},
		{"all trusted: leftmost", trusted, "10.0.0.2:5", []string{"10.0.0.7, 10.0.0.8"}, "", "10.0.0.7"},
		{"garbage stops the walk", trusted, "10.0.0.2:5", []string{"203.0.113.5, unknown, 10.0.0.9"}, "", "10.0.0.9"},
		{"entries with ports", trusted, "10.0.0.2:5", []string{"[2001:db8::1]:443, 10.0.0.3:80"}, "", "2001:db8::1"},
		{"X-Real-IP from a trusted peer", trusted, "10.0.0.2:5", nil, "203.0.113.8", "203.0.113.8"},
		{"X-Real-IP from an untrusted peer", trusted, "198.51.100.1:5", nil, "203.0.113.8", "198.51.100.1"},
		{"X-Real-IP the proxy wrote wins over XFF", trusted, "10.0.0.2:5", []string{"203.0.113.5"}, "203.0.113.8", "203.0.113.8"},
		{"a trusted X-Real-IP leaves XFF to the walk", trusted, "10.0.0.2:5", []string{"6.6.6.6, 203.0.113.5"}, "10.0.0.9", "203.0.113.5"},
		{"IPv6 peer", trusted, "[fd00::1]:5", []string{"2001:db8::7"}, "", "2001:db8::7"},
		{"mapped IPv4", trusted, "[::ffff:10.0.0.2]:5", []string{"::ffff:203.0.113.5"}, "", "203.0.113.5"},
		{"bad remote", trusted, "garbage", []string{"203.0.113.5"}, "", "invalid IP"},
	} {
		r := req("GET", "/")
		r.RemoteAddr = c.remote
		for _, x := range c.xff {
			r.Header.Add("X-Forwarded-For", x)
		}
		if c.realIP != "" {
			r.Header.Set("X-Real-IP", c.realIP)
		}
		if got := clientip.From(r, c.trusted, clientip.Auto).String(); got != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
}

// TestTrustedProxiesInRules checks that rules count by the client behind
// trusted proxies, and by the peer otherwise.
func TestTrustedProxiesInRules(t *testing.T) {
	p := mustPolicy(t, "trusted_proxies: [10.0.0.0/8]\nrules:\n  - {name: r, limit: 1/m}\n", nil)
	a := from(req("GET", "/", "X-Forwarded-For", "203.0.113.1"), "10.0.0.1:1")
	b := from(req("GET", "/", "X-Forwarded-For", "203.0.113.2"), "10.0.0.1:1")
	if !p.Check(ctx, a).Allowed || !p.Check(ctx, b).Allowed {
		t.Fatal("two clients behind one proxy share a bucket")
	}
	spoof := from(req("GET", "/", "X-Forwarded-For", "203.0.113.3"), "198.51.100.1:1")
	if rr := p.Check(ctx, spoof).Results[0]; rr.Identity != "198.51.100.1" {
		t.Fatalf("an untrusted peer chose its identity: %q", rr.Identity)
	}
}

func TestOnMissing(t *testing.T) {
	store := newFakeStore(nil)
	p := mustPolicy(t, `
rules:
  - {name: skip, match: {path: /skip}, identity: header:X-Key, limit: 1/m}
  - {name: deny, match: {path: /deny}, identity: header:X-Key, on_missing: deny, limit: 1/m}
  - {name: useip, match: {path: /useip}, identity: header:X-Key, on_missing: use_ip, limit: 1/m}
  - {name: other, match: {path: /deny}, identity: ip, limit: 5/m}
`, store)
	// skip: no store call, no bucket, allowed.
	for i := 0; i < 3; i++ {
		v := p.Check(ctx, req("GET", "/skip"))
		if !v.Allowed || !v.Results[0].Skipped || v.Limiting != -1 {
			t.Fatalf("skip: %+v", v)
		}
	}
	if n := store.Calls.Load(); n != 0 {
		t.Fatalf("skip made %d store calls", n)
	}
	// deny: 403, and the other matched rule consumes nothing.
	v := p.Check(ctx, req("GET", "/deny"))
	if v.Allowed || !v.Denied || !v.Results[0].Denied || !v.Results[1].Skipped || v.Limiting != 0 || store.Calls.Load() != 0 {
		t.Fatalf("deny: %+v (%d calls)", v, store.Calls.Load())
	}
	rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "other", Key: "192.0.2.1", N: 0})
	if rr.Result.Remaining != 5 {
		t.Fatalf("a denied request consumed from another rule: %+v", rr.Result)
	}
	if v := p.Check(ctx, req("GET", "/deny", "X-Key", "k")); !v.Allowed || v.Denied {
		t.Fatalf("deny with the identity: %+v", v)
	}
	// use_ip: counted by client IP, apart from any header value.
	v = p.Check(ctx, req("GET", "/useip"))
	if !v.Allowed || v.Results[0].Identity != "ip:192.0.2.1" || v.Results[0].Key != weir.Key("useip", "", "192.0.2.1") {
		t.Fatalf("use_ip: %+v", v.Results[0])
	}
	if v := p.Check(ctx, req("GET", "/useip")); v.Allowed {
		t.Fatal("use_ip: the second request from one IP was admitted")
	}
	if v := p.Check(ctx, from(req("GET", "/useip"), "192.0.2.2:1")); !v.Allowed {
		t.Fatal("use_ip: another IP shares the bucket")
	}
	// A header value that looks like the IP does not share its bucket.
	if v := p.Check(ctx, req("GET", "/useip", "X-Key", "ip:192.0.2.1")); !v.Allowed {
		t.Fatal("a header value reached the use_ip bucket")
	}
}

// TestPenaltyBox is the login scenario: 3 attempts in 30 minutes, then
// locked for 30 minutes, with blocked_until for a countdown.
func TestPenaltyBox(t *testing.T) {
	clock := newClock()
	p := mustPolicy(t, `
rules:
  - name: login
    match: {methods: [POST], path: /login}
    limit: 3/30m
    algorithm: sliding_log
    block: 30m
`, memstore.New(memstore.WithClock(clock.Now)))
	for i := 0; i < 3; i++ {
		if v := p.Check(ctx, req("POST", "/login")); !v.Allowed {
			t.Fatalf("attempt %d rejected", i+1)
		}
		clock.Advance(time.Minute)
	}
	v := p.Check(ctx, req("POST", "/login"))
	rr, _ := v.Limited()
	if v.Allowed || rr.Rule != "login" || !rr.Result.BlockedUntil.Equal(clock.Now().Add(30*time.Minute)) || rr.Result.RetryAfter != 30*time.Minute {
		t.Fatalf("4th attempt: %+v", rr)
	}
	until := rr.Result.BlockedUntil
	// After the window the attempts have expired, but the box holds.
	clock.Advance(29 * time.Minute)
	if v := p.Check(ctx, req("POST", "/login")); v.Allowed || !v.Results[0].Result.BlockedUntil.Equal(until) {
		t.Fatalf("admitted inside the penalty box: %+v", v.Results[0])
	}
	// Other clients are not locked out.
	if v := p.Check(ctx, from(req("POST", "/login"), "192.0.2.99:1")); !v.Allowed {
		t.Fatal("another client was locked out")
	}
	clock.Set(until)
	if v := p.Check(ctx, req("POST", "/login")); !v.Allowed {
		t.Fatalf("still locked after the box: %+v", v.Results[0])
	}
}

func TestTiers(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - name: api
    identity: header:X-API-Key
    algorithm: fixed_window
    tiers:
      by: header:X-Plan
      default: {limit: 2/h}
      pro: {limit: 5/h}
      burst: {limit: 10/h burst 4, algorithm: token_bucket}
`, nil)
	count := func(key, plan string) (n int, tier string, lim weir.Limit) {
		for i := 0; i < 20; i++ {
			r := req("GET", "/", "X-API-Key", key)
			if plan != "" {
				r.Header.Set("X-Plan", plan)
			}
			v := p.Check(ctx, r)
			tier, lim = v.Results[0].Tier, v.Results[0].Limit
			if v.Allowed {
				n++
			}
		}
		return n, tier, lim
	}
	for _, c := range []struct {
		key, plan, tier string
		n               int
		algo            weir.Algorithm
	}{
		{"k1", "", "default", 2, weir.FixedWindow},
		{"k2", "pro", "pro", 5, weir.FixedWindow},
		{"k3", "gold", "default", 2, weir.FixedWindow}, // unknown tier → default
		{"k4", "burst", "burst", 4, weir.TokenBucket},
	} {
		n, tier, lim := count(c.key, c.plan)
		if n != c.n || tier != c.tier || lim.Algorithm != c.algo {
			t.Errorf("key %s plan %q: %d admitted under tier %q (%v), want %d under %q", c.key, c.plan, n, tier, lim, c.n, c.tier)
		}
	}
	if l, err := p.Limit("api", "pro"); err != nil || l.Rate != 5 {
		t.Fatalf("Limit: %v %v", l, err)
	}
}

func TestShadow(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: real, identity: const:x, limit: 2/h, algorithm: fixed_window}
  - {name: trial, identity: const:x, limit: 1/h, algorithm: fixed_window, shadow: true}
`, nil)
	v := p.Check(ctx, req("GET", "/"))
	if !v.Allowed || v.Limiting != 0 || !v.Results[1].Shadow || !v.Results[1].Result.Allowed {
		t.Fatalf("1st: %+v", v)
	}
	// The shadow rule rejects; the real one still admits and consumes.
	v = p.Check(ctx, req("GET", "/"))
	if !v.Allowed || v.Results[1].Result.Allowed || v.Results[0].Result.Remaining != 0 || v.Limiting != 0 {
		t.Fatalf("2nd: %+v", v)
	}
	v = p.Check(ctx, req("GET", "/"))
	if v.Allowed || v.Limiting != 0 {
		t.Fatalf("3rd: %+v", v)
	}

	// Global shadow: nothing ever blocks, every result is reported.
	g := mustPolicy(t, "shadow: true\nrules:\n  - {name: r, identity: const:x, limit: 1/h}\n", nil)
	for i := 0; i < 3; i++ {
		v := g.Check(ctx, req("GET", "/"))
		if !v.Allowed || v.Limiting != -1 || !v.Results[0].Shadow || v.Results[0].Result.Allowed != (i == 0) {
			t.Fatalf("global shadow, request %d: %+v", i, v)
		}
	}
	if g.Rules()[0].Shadow != true {
		t.Fatal("RuleInfo.Shadow not set by the global shadow")
	}
}

func TestAllowDeny(t *testing.T) {
	store := newFakeStore(nil)
	p := mustPolicy(t, `
trusted_proxies: [10.0.0.0/8]
allow:
  - 127.0.0.1
  - 198.51.100.0/24
  - {identity: header:X-API-Key, values: [internal]}
deny:
  - 203.0.113.0/24
  - 198.51.100.66/32
  - {identity: query:token, values: [revoked]}
rules:
  - {name: r, identity: const:x, limit: 1/h}
`, store)
	for _, c := range []struct {
		name          string
		r             *http.Request
		denied, allow bool
	}{
		{"deny CIDR", from(req("GET", "/"), "203.0.113.50:1"), true, false},
		{"deny behind a trusted proxy", from(req("GET", "/", "X-Forwarded-For", "203.0.113.50"), "10.1.1.1:1"), true, false},
		{"deny wins over allow", from(req("GET", "/"), "198.51.100.66:1"), true, false},
		{"deny value", req("GET", "/?token=revoked"), true, false},
		{"allow address", from(req("GET", "/"), "127.0.0.1:1"), false, true},
		{"allow CIDR", from(req("GET", "/"), "198.51.100.7:1"), false, true},
		{"allow value", req("GET", "/", "X-API-Key", "internal"), false, true},
	} {
		for i := 0; i < 3; i++ {
			v := p.Check(ctx, c.r)
			if v.Denied != c.denied || v.AllowListed != c.allow || v.Allowed != c.allow || len(v.Results) != 0 || v.Limiting != -1 {
				t.Fatalf("%s: %+v", c.name, v)
			}
		}
	}
	if n := store.Calls.Load(); n != 0 {
		t.Fatalf("lists made %d store calls", n)
	}
	if v := p.Check(ctx, req("GET", "/", "X-API-Key", "other")); !v.Allowed || store.Calls.Load() != 1 {
		t.Fatalf("an unlisted request: %+v", v)
	}
}

// TestAllOrNothing: per-IP, per-user and global limits; when the per-user
// limit rejects, the others consume nothing.
func TestAllOrNothing(t *testing.T) {
	for _, multi := range []bool{true, false} {
		var store weir.Store = memstore.New()
		if !multi {
			store = singleStore{store}
		}
		p := mustPolicy(t, `
rules:
  - {name: per-ip, identity: ip, limit: 10/h, algorithm: sliding_window}
  - {name: per-user, identity: header:X-User, limit: 3/h, algorithm: fixed_window}
  - {name: global, identity: const:all, limit: 1000/h, algorithm: token_bucket}
`, store)
		for i := 0; i < 3; i++ {
			if v := p.Check(ctx, req("GET", "/", "X-User", "u1")); !v.Allowed {
				t.Fatalf("request %d rejected", i)
			}
		}
		for i := 0; i < 5; i++ {
			v := p.Check(ctx, req("GET", "/", "X-User", "u1"))
			if rr, _ := v.Limited(); v.Allowed || rr.Rule != "per-user" || rr.Result.RetryAfter <= 0 {
				t.Fatalf("multi=%v: request %d: %+v", multi, i+4, v)
			}
		}
		perIP := int64(7) // every weir.Store decides a batch all or nothing (Do)
		for rule, want := range map[string]int64{"per-ip": perIP, "global": 997} {
			key := map[string]string{"per-ip": "192.0.2.1", "global": "all"}[rule]
			rr, err := p.CheckKey(ctx, KeyRequest{Rule: rule, Key: key, N: 0})
			if err != nil || rr.Result.Remaining != want {
				t.Fatalf("multi=%v: %s remaining %d, want %d (%v)", multi, rule, rr.Result.Remaining, want, err)
			}
		}
	}
}

func TestLimiting(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: a, identity: const:x, limit: 10/h, algorithm: fixed_window}
  - {name: b, identity: const:x, limit: 4/h, algorithm: fixed_window}
  - {name: c, identity: const:x, limit: 100/h, algorithm: fixed_window}
`, nil)
	v := p.Check(ctx, req("GET", "/"))
	if rr, _ := v.Limited(); v.Limiting != 1 || rr.Rule != "b" || rr.Result.Remaining != 3 {
		t.Fatalf("%+v", v)
	}
	empty := mustPolicy(t, "rules: []\n", nil)
	if v := empty.Check(ctx, req("GET", "/")); !v.Allowed || v.Limiting != -1 || len(v.Results) != 0 {
		t.Fatalf("no rules: %+v", v)
	}
}

func TestCheckKey(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: login, limit: 3/h, algorithm: sliding_log, block: 1h}
`, nil)
	if _, err := p.CheckKey(ctx, KeyRequest{Rule: "nope", Key: "k", N: 1}); !errors.Is(err, ErrUnknownRule) {
		t.Fatalf("unknown rule: %v", err)
	}
	if _, err := p.CheckKey(ctx, KeyRequest{Rule: "login", Key: "", N: 1}); err == nil {
		t.Fatal("empty key accepted")
	}
	for _, hits := range []int64{-1, 4} {
		if _, err := p.CheckKey(ctx, KeyRequest{Rule: "login", Key: "k", N: hits}); !errors.Is(err, weir.ErrInvalidCost) {
			t.Fatalf("hits %d: %v", hits, err)
		}
	}
	rr, err := p.CheckKey(ctx, KeyRequest{Rule: "login", Key: "192.0.2.1", N: 2})
	if err != nil || !rr.Result.Allowed || rr.Result.Remaining != 1 || rr.Key != weir.Key("login", "192.0.2.1") || rr.Tier != "default" {
		t.Fatalf("%+v %v", rr, err)
	}
	// Check with the same identity sees it.
	if v := p.Check(ctx, req("GET", "/")); !v.Allowed || v.Results[0].Result.Remaining != 0 {
		t.Fatalf("Check after CheckKey: %+v", v.Results[0])
	}
	if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "login", Key: "192.0.2.1", N: 0}); rr.Result.Allowed || rr.Result.Remaining != 0 {
		t.Fatalf("peek: %+v", rr.Result)
	}
	if err := p.Reset(ctx, "login", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "login", Key: "192.0.2.1", N: 0}); !rr.Result.Allowed || rr.Result.Remaining != 3 {
		t.Fatalf("after Reset: %+v", rr.Result)
	}
	if err := p.Reset(ctx, "nope", "k"); !errors.Is(err, ErrUnknownRule) {
		t.Fatalf("Reset of an unknown rule: %v", err)
	}
}

func TestConcurrencyRelease(t *testing.T) {
	p := mustPolicy(t, "rules:\n  - {name: c, identity: const:x, limit: 2/m, algorithm: concurrency}\n", nil)
	v1 := p.Check(ctx, req("GET", "/"))
	v2 := p.Check(ctx, req("GET", "/"))
	v3 := p.Check(ctx, req("GET", "/"))
	if !v1.Allowed || !v2.Allowed || v3.Allowed {
		t.Fatalf("%v %v %v", v1.Allowed, v2.Allowed, v3.Allowed)
	}
	if err := v3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v := p.Check(ctx, req("GET", "/")); !v.Allowed {
		t.Fatal("a released slot was not given back")
	}
	if v := p.Check(ctx, req("GET", "/")); v.Allowed {
		t.Fatal("more slots than the limit")
	}
}

// TestCheckParallel hammers Check from many goroutines with several
// identities: exactly the limit is admitted per identity, and the global
// rule consumed exactly what was admitted.
func TestCheckParallel(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: per-user, identity: header:X-User, limit: 40/h, algorithm: fixed_window}
  - {name: global, identity: const:all, limit: 150/h, algorithm: fixed_window}
  - {name: watch, identity: header:X-User, limit: 10/h, algorithm: gcra, shadow: true}
`, nil)
	users := []string{"a", "b", "c", "d", "e"}
	var admitted [5]atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 20; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 60; i++ {
				u := (g + i) % len(users)
				if v := p.Check(ctx, req("GET", "/", "X-User", users[u])); v.Allowed {
					admitted[u].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	total := int64(0)
	for u := range users {
		n := admitted[u].Load()
		total += n
		if n > 40 {
			t.Errorf("user %s: %d admitted, over the limit of 40", users[u], n)
		}
	}
	if total != 150 {
		t.Fatalf("%d admitted in all, want exactly the global 150", total)
	}
	rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "global", Key: "all", N: 0})
	if rr.Result.Remaining != 0 {
		t.Fatalf("global remaining %d", rr.Result.Remaining)
	}
	// Per user: remaining = 40 - admitted, exactly.
	for u := range users {
		rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "per-user", Key: users[u], N: 0})
		if got, want := rr.Result.Remaining, 40-admitted[u].Load(); got != want {
			t.Errorf("user %s: remaining %d, want %d", users[u], got, want)
		}
	}
}

// TestCheckParallelPerUser: many goroutines, several identities, one
// rule: exactly the limit each.
func TestCheckParallelPerUser(t *testing.T) {
	p := mustPolicy(t, "rules:\n  - {name: r, identity: header:X-User, limit: 25/h, algorithm: sliding_log}\n", nil)
	var admitted [4]atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				u := (g + i) % 4
				if p.Check(ctx, req("GET", "/", "X-User", string(rune('a'+u)))).Allowed {
					admitted[u].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for u := range admitted {
		if n := admitted[u].Load(); n != 25 {
			t.Errorf("user %c: %d admitted, want exactly 25", 'a'+u, n)
		}
	}
}

func TestObserver(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	p := mustPolicy(t, `
rules:
  - {name: a, identity: const:x, limit: 5/m}
  - {name: s, identity: const:x, limit: 5/m, shadow: true}
  - {name: k, identity: header:X-Missing, limit: 5/m}
`, nil, WithObserver(func(_ context.Context, r RuleResult, _ time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		tag := r.Rule
		switch {
		case r.Skipped:
			tag += ":skipped"
		case r.Shadow:
			tag += ":shadow"
		}
		seen = append(seen, tag)
	}))
	p.Check(ctx, req("GET", "/"))
	if _, err := p.CheckKey(ctx, KeyRequest{Rule: "a", Key: "x", N: 1}); err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "s:shadow", "k:skipped", "a"}
	if !reflect.DeepEqual(seen, want) {
		t.Fatalf("observed %v, want %v", seen, want)
	}
}

// TestLimitingFewestRemaining: the limiting result is the one with the
// fewest requests remaining, the limit the client meets first, not the
// one with the smallest share of its quota left; and Check agrees with
// httplimit.MostRestrictive, which renders the service's headers, on the
// same results.
func TestLimitingFewestRemaining(t *testing.T) {
	p := mustPolicy(t, `
rules:
  - {name: big, identity: const:x, limit: 100/h, algorithm: sliding_log}
  - {name: small, identity: const:x, limit: 10/h, algorithm: sliding_log}
`, nil)
	if _, err := p.CheckKey(ctx, KeyRequest{Rule: "big", Key: "x", N: 59}); err != nil {
		t.Fatal(err)
	}
	v := p.Check(ctx, req("GET", "/"))
	rr, _ := v.Limited()
	// big: 40 of 100 left (40%); small: 9 of 10 left (90%), but 9 < 40.
	if v.Limiting != 1 || rr.Rule != "small" || rr.Result.Remaining != 9 || v.Results[0].Result.Remaining != 40 {
		t.Fatalf("limiting %d (%s, %d left); results %+v", v.Limiting, rr.Rule, rr.Result.Remaining, v.Results)
	}
	st, limiting := StatusesOf(&v)
	if want := httplimit.MostRestrictive(st); limiting != want {
		t.Fatalf("StatusesOf limiting %d, httplimit.MostRestrictive %d", limiting, want)
	}
}
