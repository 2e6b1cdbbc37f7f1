package policy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/memstore"
)

// TestClientIPHeader checks client_ip_header: behind nginx configured the
// common way (proxy_set_header X-Real-IP $remote_addr, the client's own
// X-Forwarded-For passed on), the address nginx wrote is the client, not
// the one the client wrote.
func TestClientIPHeader(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, c := range []struct {
		name, header string
		peer         string
		xff, real    string
		cf           string
		want         string
	}{
		{"auto: X-Real-IP beats a client's XFF", "auto", "10.0.0.2:1", "6.6.6.6", "203.0.113.8", "", "203.0.113.8"},
		{"auto: empty means auto", "", "10.0.0.2:1", "6.6.6.6", "203.0.113.8", "", "203.0.113.8"},
		{"auto: no X-Real-IP, XFF walked", "auto", "10.0.0.2:1", "6.6.6.6, 203.0.113.5", "", "", "203.0.113.5"},
		{"auto: garbage X-Real-IP, XFF walked", "auto", "10.0.0.2:1", "203.0.113.5", "unknown", "", "203.0.113.5"},
		{"auto: untrusted peer", "auto", "198.51.100.1:1", "6.6.6.6", "7.7.7.7", "", "198.51.100.1"},
		{"XFF: multi-hop chain, X-Real-IP ignored", "X-Forwarded-For", "10.0.0.2:1", "6.6.6.6, 203.0.113.5, 10.0.0.3", "10.0.0.3", "", "203.0.113.5"},
		{"XFF: none, the peer", "X-Forwarded-For", "10.0.0.2:1", "", "203.0.113.8", "", "10.0.0.2"},
		{"XFF in lower case: walked", "x-forwarded-for", "10.0.0.2:1", "6.6.6.6, 203.0.113.5, 10.0.0.3", "", "", "203.0.113.5"},
		{"AUTO", "AUTO", "10.0.0.2:1", "6.6.6.6", "203.0.113.8", "", "203.0.113.8"},
		{"X-Real-IP: XFF ignored", "X-Real-IP", "10.0.0.2:1", "203.0.113.5", "203.0.113.8", "", "203.0.113.8"},
		{"X-Real-IP: missing, the peer", "x-real-ip", "10.0.0.2:1", "203.0.113.5", "", "", "10.0.0.2"},
		{"CF-Connecting-IP", "CF-Connecting-IP", "10.0.0.2:1", "6.6.6.6", "7.7.7.7", "2001:db8::5", "2001:db8::5"},
		{"CF-Connecting-IP from an untrusted peer", "CF-Connecting-IP", "198.51.100.1:1", "", "", "2001:db8::5", "198.51.100.1"},
	} {
		r := from(req("GET", "/"), c.peer)
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if c.real != "" {
			r.Header.Set("X-Real-IP", c.real)
		}
		if c.cf != "" {
			r.Header.Set("CF-Connecting-IP", c.cf)
		}
		h, ok := clientip.CanonicalHeader(c.header)
		if !ok {
			t.Fatalf("%s: clientip.CanonicalHeader(%q) not ok", c.name, c.header)
		}
		if got := clientip.From(r, trusted, h).String(); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
		// The non-canonical spelling reads the same header.
		if got := clientip.From(r, trusted, c.header).String(); got != c.want {
			t.Errorf("%s, header as written: %s, want %s", c.name, got, c.want)
		}
	}
}

// TestClientIPHeaderPolicy runs client_ip_header through a policy: six
// logins each with a fresh X-Forwarded-For, through a proxy that sets
// X-Real-IP, are one client.
func TestClientIPHeaderPolicy(t *testing.T) {
	for _, h := range []string{"", "client_ip_header: auto\n", "client_ip_header: X-Real-IP\n"} {
		p := mustPolicy(t, "trusted_proxies: [127.0.0.1/32]\n"+h+"rules:\n  - {name: login, match: {methods: [POST], path: /login}, identity: ip, limit: 3/m}\n", memstore.New())
		allowed := 0
		for i := range 6 {
			r := from(req("POST", "/login", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1), "X-Real-IP", "203.0.113.50"), "127.0.0.1:4000")
			if p.Check(ctx, r).Allowed {
				allowed++
			}
		}
		if allowed != 3 {
			t.Errorf("%q: %d of 6 logins allowed, want 3", h, allowed)
		}
	}
}

func TestClientIPFromAllocs(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	r := from(req("GET", "/", "X-Forwarded-For", "6.6.6.6, 198.51.100.7", "X-Real-IP", "203.0.113.8", "Cf-Connecting-Ip", "2001:db8::1"), "10.0.0.1:1")
	for _, h := range []string{clientip.Auto, clientip.ForwardedFor, "X-Real-Ip", "Cf-Connecting-Ip"} {
		if n := testing.AllocsPerRun(100, func() { clientip.From(r, trusted, h) }); n != 0 {
			t.Errorf("ClientIPFrom with %s: %v allocations, want 0", h, n)
		}
	}
}

// TestIPv6RotationGrouped: one host's /64 is one client under ip.
func TestIPv6RotationGrouped(t *testing.T) {
	for _, c := range []struct {
		identity string
		want     int
	}{{"ip", 1}, {"ip/24", 1}, {"ip/128", 20}, {"ip/32/128", 20}} {
		p := mustPolicy(t, "rules:\n  - {name: r, identity: \""+c.identity+"\", limit: 1/15m}\n", memstore.New())
		allowed := 0
		for i := range 20 {
			r := from(req("GET", "/"), fmt.Sprintf("[2001:db8:aa:bb::%x]:443", i+1))
			if p.Check(ctx, r).Allowed {
				allowed++
			}
		}
		if allowed != c.want {
			t.Errorf("%s: %d of 20 requests from one /64 admitted, want %d", c.identity, allowed, c.want)
		}
	}
}

// TestCheckKeyCanonicalIP: keys of an ip rule given to CheckKey and Reset
// are canonical, as Check's are, so one client is one counter however
// its address is spelled.
func TestCheckKeyCanonicalIP(t *testing.T) {
	const doc = `rules:
  - {name: per-ip, identity: ip, limit: 1/m}
  - {name: net, identity: ip/24, limit: 1/m}
  - {name: whole, identity: ip/32/128, limit: 1/m}
  - {name: api, identity: header:X-API-Key, limit: 1/m}
`
	p := mustPolicy(t, doc, memstore.New())
	for _, c := range []struct {
		rule, first, second, identity string
	}{
		{"per-ip", "::ffff:203.0.113.9", "203.0.113.9", "203.0.113.9"},
		{"per-ip", "2001:DB8::1", "2001:db8:0::1", "2001:db8::/64"},
		{"per-ip", "2001:db8:1::1", "2001:db8:1::ffff", "2001:db8:1::/64"},
		{"per-ip", "2001:db8:5::/64", "2001:db8:5::9", "2001:db8:5::/64"},
		{"net", "198.51.100.7", "198.51.100.0/24", "198.51.100.0/24"},
		{"net", "::ffff:198.51.101.7", "198.51.101.200", "198.51.101.0/24"},
		{"whole", "2001:DB8::1", "2001:db8:0:0::1", "2001:db8::1"},
	} {
		rr, err := p.CheckKey(ctx, KeyRequest{Rule: c.rule, Key: c.first, N: 1})
		if err != nil || !rr.Result.Allowed || rr.Identity != c.identity || rr.Key != weir.Key(c.rule, c.identity) {
			t.Fatalf("%s %q: %+v %v, want allowed as %q", c.rule, c.first, rr, err, c.identity)
		}
		rr, err = p.CheckKey(ctx, KeyRequest{Rule: c.rule, Key: c.second, N: 1})
		if err != nil || rr.Result.Allowed {
			t.Errorf("%s: %q after %q: allowed %v (%v); want one counter", c.rule, c.second, c.first, rr.Result.Allowed, err)
		}
		// The key /v1/auth and the middleware use is the same counter.
		if k, err := p.CanonicalKey(c.rule, c.second); err != nil || k != c.identity {
			t.Errorf("CanonicalKey(%s, %q) = %q, %v; want %q", c.rule, c.second, k, err, c.identity)
		}
		if err := p.Reset(ctx, c.rule, c.second); err != nil {
			t.Fatal(err)
		}
		if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: c.rule, Key: c.first, N: 1}); !rr.Result.Allowed {
			t.Errorf("%s: Reset(%q) did not clear %q", c.rule, c.second, c.first)
		}
	}
	// A request's own identity and CheckKey's meet.
	r := from(req("GET", "/"), "[2001:db8:77::1]:1")
	if v := p.Check(ctx, r); !v.Allowed {
		t.Fatal("first request limited")
	}
	if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "per-ip", Key: "2001:DB8:77:0:ffff::2", N: 1}); rr.Result.Allowed {
		t.Error("CheckKey of another address of the request's /64 is allowed; want the request's counter")
	}
	for _, c := range []struct{ rule, key, want string }{
		{"per-ip", "2001:db8::/32", "/64"},
		{"net", "198.51.0.0/16", "/24"},
	} {
		_, err := p.CheckKey(ctx, KeyRequest{Rule: c.rule, Key: c.key, N: 1})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.key) {
			t.Errorf("CheckKey(%s, %q): %v, want an error naming %s and the key", c.rule, c.key, err, c.want)
		}
		if err := p.Reset(ctx, c.rule, c.key); err == nil {
			t.Errorf("Reset(%s, %q): no error", c.rule, c.key)
		}
	}
	// A zone is dropped, as ClientIP drops it.
	if k, err := p.CanonicalKey("whole", "fe80::1%eth0"); err != nil || k != "fe80::1" {
		t.Errorf("zone: %q %v", k, err)
	}
	// A key that is no address is an identity of its own, as before.
	for _, k := range []string{"not-an-ip", "ip:203.0.113.9", "203.0.113.9:443"} {
		if rr, err := p.CheckKey(ctx, KeyRequest{Rule: "per-ip", Key: k, N: 1}); err != nil || rr.Identity != k {
			t.Errorf("CheckKey(per-ip, %q): %+v %v", k, rr, err)
		}
	}
	// Other identities take the key as it is.
	if rr, err := p.CheckKey(ctx, KeyRequest{Rule: "api", Key: "2001:DB8::1", N: 1}); err != nil || rr.Identity != "2001:DB8::1" {
		t.Errorf("api: %+v %v", rr, err)
	}
}

// TestProxySettingsValidation: client_ip_header and server.auth_headers
// refuse bad values with line and column.
func TestProxySettingsValidation(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"client_ip_header: \"X Real IP\"\nrules: []\n", `config:1:19: client_ip_header "X Real IP" is not a header name`},
		{"server:\n  auth_headers: nginx\nrules: []\n", `config:2:17: auth_headers "nginx" is not a header family`},
	} {
		_, err := Parse([]byte(c.doc), "")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %s", c.doc, err, c.want)
		}
	}
	for _, doc := range []string{
		"client_ip_header: CF-Connecting-IP\nserver: {auth_headers: forwarded}\nrules: []\n",
		"client_ip_header: auto\nserver: {auth_headers: original}\nrules: []\n",
		"client_ip_header: X-Forwarded-For\nserver: {auth_headers: auto}\nrules: []\n",
	} {
		if _, err := Parse([]byte(doc), ""); err != nil {
			t.Errorf("%q: %v", doc, err)
		}
	}
	if _, err := New(&config.Config{ClientIPHeader: "a b"}, nil); err == nil || !strings.Contains(err.Error(), `"a b"`) {
		t.Errorf("New with a bad ClientIPHeader: %v", err)
	}
}
