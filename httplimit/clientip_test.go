package httplimit

import (
	"time"

	"github.com/weir-dev/weir"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

// TestIPKey checks client-IP extraction, spoofing attempts included.
func TestIPKey(t *testing.T) {
	proxies := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("127.0.0.1/32"),
		netip.MustParsePrefix("2001:db8:ff::/48"),
	}
	for _, tc := range []struct {
		name    string
		remote  string
		xff     []string // one X-Forwarded-For line each
		trusted []netip.Prefix
		want    string
	}{
		{"peer", "192.0.2.1:4321", nil, proxies, "192.0.2.1"},
		{"peer v6", "[2001:db8::1]:4321", nil, proxies, "2001:db8::1"},
		{"peer v4-mapped", "[::ffff:192.0.2.1]:80", nil, proxies, "192.0.2.1"},
		{"peer with zone", "[fe80::1%eth0]:80", nil, proxies, "fe80::1"},
		{"peer without port", "192.0.2.1", nil, proxies, "192.0.2.1"},
		{"no address", "@", nil, proxies, ""},

		// Spoofing: an untrusted peer's X-Forwarded-For is ignored.
		{"untrusted peer sends XFF", "192.0.2.1:1", []string{"198.51.100.7"}, proxies, "192.0.2.1"},
		{"untrusted peer claims a proxy", "192.0.2.1:1", []string{"10.0.0.1"}, proxies, "192.0.2.1"},
		{"no trusted proxies", "10.0.0.1:1", []string{"198.51.100.7"}, nil, "10.0.0.1"},

		// A trusted proxy: the rightmost untrusted entry is the client.
		{"one proxy", "10.0.0.1:1", []string{"198.51.100.7"}, proxies, "198.51.100.7"},
		{"client prepends a lie", "10.0.0.1:1", []string{"203.0.113.9, 198.51.100.7"}, proxies, "198.51.100.7"},
		{"several trusted hops", "127.0.0.1:1", []string{"203.0.113.9, 198.51.100.7, 10.1.1.1, 10.2.2.2"}, proxies, "198.51.100.7"},
		{"hops over several lines", "10.0.0.1:1", []string{"203.0.113.9", "198.51.100.7,10.3.3.3", "10.1.1.1"}, proxies, "198.51.100.7"},
		{"client lies about a proxy", "10.0.0.1:1", []string{"10.9.9.9, 198.51.100.7"}, proxies, "198.51.100.7"},
		{"v6 hops", "[2001:db8:ff::1]:1", []string{"2001:db8:1::5, 2001:db8:ff::2"}, proxies, "2001:db8:1::5"},
		{"entries with ports", "10.0.0.1:1", []string{"[2001:db8:1::5]:443, 198.51.100.7:8080"}, proxies, "198.51.100.7"},
		{"spaces and empty entries", "10.0.0.1:1", []string{" , 198.51.100.7 ,, "}, proxies, "198.51.100.7"},
		{"all trusted", "10.0.0.1:1", []string{"10.5.5.5, 10.6.6.6"}, proxies, "10.5.5.5"},
		{"empty XFF", "10.0.0.1:1", []string{""}, proxies, "10.0.0.1"},
		{"garbage stops the walk", "10.0.0.1:1", []string{"198.51.100.7, unknown"}, proxies, "10.0.0.1"},
		{"garbage left of the client", "10.0.0.1:1", []string{"unknown, 198.51.100.7"}, proxies, "198.51.100.7"},
		{"mapped entry", "10.0.0.1:1", []string{"::ffff:198.51.100.7"}, proxies, "198.51.100.7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remote
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			want := tc.want
			if want == "" {
				want = tc.remote
			}
			k := ipKeyer{trusted: tc.trusted, header: "auto", bits4: 32, bits6: 128}
			if got := k.key(r); got != want {
				t.Errorf("ipKey = %q, want %q", got, want)
			}
		})
	}
}

// X-Real-IP counts only from a trusted peer, and then wins over the
// X-Forwarded-For a client can write through a proxy that sets X-Real-IP.
func TestIPKeyRealIP(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct{ remote, xff, want string }{
		{"10.0.0.1:1", "", "198.51.100.7"},
		{"192.0.2.1:1", "", "192.0.2.1"},
		{"10.0.0.1:1", "198.51.100.8", "198.51.100.7"},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tc.remote
		r.Header.Set("X-Real-IP", "198.51.100.7")
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		k := ipKeyer{trusted: proxies, header: "auto", bits4: 32, bits6: 128}
		if got := k.key(r); got != tc.want {
			t.Errorf("peer %s, X-Forwarded-For %q: ipKey = %q, want %q", tc.remote, tc.xff, got, tc.want)
		}
	}
}

func TestKeyByIP(t *testing.T) {
	c := newClock()
	trusted := netip.MustParsePrefix("10.0.0.0/8")
	h := New(newLimiter(c), login, KeyByIP(trusted))(hello)
	// Five requests through the proxy on behalf of one client use up its quota...
	for i := 0; i < 5; i++ {
		if w := do(h, "10.0.0.1:1", "X-Forwarded-For", "198.51.100.7"); w.Code != 200 {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	if w := do(h, "10.0.0.2:1", "X-Forwarded-For", "203.0.113.1, 198.51.100.7"); w.Code != 429 {
		t.Errorf("same client via another proxy, with a spoofed entry: %d, want 429", w.Code)
	}
	// ...but not another client's, nor the proxy's own.
	if w := do(h, "10.0.0.1:1", "X-Forwarded-For", "198.51.100.8"); w.Code != 200 {
		t.Errorf("another client: %d", w.Code)
	}
	// A client talking directly cannot borrow another's quota or escape its own.
	for i := 0; i < 5; i++ {
		if w := do(h, "192.0.2.1:1", "X-Forwarded-For", "198.51.100.99"); w.Code != 200 {
			t.Fatalf("direct request %d: %d", i, w.Code)
		}
	}
	if w := do(h, "192.0.2.1:1", "X-Forwarded-For", "198.51.100.100"); w.Code != 429 {
		t.Errorf("direct client changing its XFF: %d, want 429", w.Code)
	}
}

func TestDefaultKeyIgnoresXFF(t *testing.T) {
	c := newClock()
	h := New(newLimiter(c), weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute})(hello)
	do(h, "10.0.0.1:1", "X-Forwarded-For", "198.51.100.1")
	if w := do(h, "10.0.0.1:2", "X-Forwarded-For", "198.51.100.2"); w.Code != 429 {
		t.Errorf("default key trusted X-Forwarded-For: %d", w.Code)
	}
	// Peers without an address share the key RemoteAddr gives.
	do(h, "@", "X-Forwarded-For", "198.51.100.1")
	if w := do(h, "@"); w.Code != 429 {
		t.Errorf("unix-socket peers: %d", w.Code)
	}
}
