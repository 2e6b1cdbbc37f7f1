package policy

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// TestIPKey checks the ip identity and key built without Addr.String
// against ipValue's definition and weir.Key.
func TestIPKey(t *testing.T) {
	ref := func(a netip.Addr, bits4, bits6 int) string {
		bits := bits6
		if a.Is4() {
			bits = bits4
		}
		if bits >= a.BitLen() {
			return a.String()
		}
		p, err := a.Prefix(bits)
		if err != nil {
			return a.String()
		}
		return p.String()
	}
	rng := rand.New(rand.NewPCG(7, 8))
	var addrs []netip.Addr
	for range 300 {
		var b16 [16]byte
		for i := range b16 {
			b16[i] = byte(rng.Uint32())
		}
		addrs = append(addrs, netip.AddrFrom4([4]byte(b16[:4])), netip.AddrFrom16(b16))
	}
	addrs = append(addrs, netip.MustParseAddr("2001:db8:85a3:1234:5678:8a2e:370:7334"), netip.MustParseAddr("::"), netip.MustParseAddr("0.0.0.0"))
	for _, a := range addrs {
		for _, bits := range [][2]int{{32, 128}, {24, 128}, {32, 64}, {16, 48}, {1, 1}, {31, 127}} {
			want := ref(a, bits[0], bits[1])
			if got := ipValue(a, bits[0], bits[1]); got != want {
				t.Fatalf("ipValue(%v, %v) = %q, want %q", a, bits, got, want)
			}
			id, key, ok := ipKey("per-ip", a, bits[0], bits[1])
			if !ok || id != want || key != weir.Key("per-ip", want) {
				t.Fatalf("ipKey(%v, %v) = %q, %q, %v; want %q, %q", a, bits, id, key, ok, want, weir.Key("per-ip", want))
			}
		}
		id, key, ok := useIPKey("r", a)
		if v := ref(a, 32, 64); !ok || id != "ip:"+v || key != weir.Key("r", "", v) {
			t.Fatalf("useIPKey(%v) = %q, %q, %v", a, id, key, ok)
		}
	}
	if _, _, ok := ipKey("r", netip.Addr{}, 32, 128); ok {
		t.Error("ipKey of no address is ok")
	}
	if _, _, ok := useIPKey("r", netip.Addr{}); ok {
		t.Error("useIPKey of no address is ok")
	}
}

// TestCheckAllocs keeps the decision path allocation-free: Check makes
// Verdict.Results and one store key per matched rule, and nothing else,
// except an IPv6 ip identity, which needs its own string besides the key.
func TestCheckAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items, which allocates")
	}
	const doc = `
trusted_proxies: [10.0.0.0/8]
deny: [203.0.113.0/24]
rules:
  - {name: per-ip, match: {path: /api/}, identity: ip, limit: 1000000/s}
  - {name: per-key, match: {path: "/api/{x}"}, identity: header:X-API-Key, limit: 1000000/s}
  - {name: login, match: {methods: [POST], path: /login}, limit: 5/m}
  - {name: net, match: {path: /net/}, identity: ip/24/64, limit: 1000000/s}
  - {name: route, match: {path: "/r/{id}"}, identity: route, limit: 1000000/s}
  - {name: host, match: {host: "*.Example.com", methods: [GET]}, identity: "const:all", limit: 1000000/s}
  - {name: shadow, match: {path: /shadow}, identity: ip, limit: 1000000/s, shadow: true}
`
	observed := 0
	for _, c := range []struct {
		name     string
		observe  bool
		method   string
		target   string
		host     string
		remote   string
		xff      string
		rules    int // the rules that apply
		maxAlloc float64
	}{
		// The benchmark: per-ip and per-key, from behind a proxy.
		{"benchmark", false, "GET", "/api/items", "", "10.0.0.1:1", "198.51.100.7", 2, 3},
		{"benchmark observed", true, "GET", "/api/items", "", "10.0.0.1:1", "198.51.100.7", 2, 3},
		{"several hops", false, "GET", "/api/items", "", "10.0.0.1:1", "6.6.6.6, 198.51.100.7, 10.0.0.3", 2, 3},
		// Cleaning the path costs path.Clean's two allocations, once for
		// all the rules.
		{"unclean path", false, "GET", "/api/./items", "", "192.0.2.1:1", "", 2, 5},
		// An escape the client chose (URL.RawPath): URL.EscapedPath checks
		// it by unescaping it, once; the rules compare without unescaping.
		{"escaped path", false, "GET", "/api/%69tems", "", "192.0.2.1:1", "", 2, 4},
		{"prefix", false, "GET", "/net/x", "", "192.0.2.1:1", "", 1, 2},
		// Counting by route or a constant alone, the key is the rule's.
		{"route", false, "GET", "/r/42", "", "192.0.2.1:1", "", 1, 1},
		{"host", false, "GET", "/x", "A.EXAMPLE.com:8443", "192.0.2.1:1", "", 1, 1},
		{"shadow", false, "GET", "/shadow", "", "192.0.2.1:1", "", 1, 2},
		{"IPv6 client", false, "GET", "/api/items", "", "[2001:db8::1]:1", "", 2, 4},
		{"no rule", false, "GET", "/other", "", "192.0.2.1:1", "", 0, 0},
		{"deny list", false, "GET", "/api/items", "", "203.0.113.9:1", "", 0, 0},
	} {
		opts := []Option(nil)
		if c.observe {
			opts = append(opts, WithObserver(func(context.Context, RuleResult, time.Duration) { observed++ }))
		}
		p := mustPolicy(t, doc, memstore.New(), opts...)
		r := req(c.method, c.target, "X-API-Key", "k1")
		r.RemoteAddr = c.remote
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if c.host != "" {
			r.Host = c.host
		}
		if v := p.Check(ctx, r); len(v.Results) != c.rules || (c.rules > 0 && !v.Allowed) {
			t.Fatalf("%s: %d results %v, allowed %v; want %d", c.name, len(v.Results), names(v), v.Allowed, c.rules)
		}
		got := testing.AllocsPerRun(200, func() { p.Check(ctx, r) })
		t.Logf("%s: %v", c.name, got)
		if got > c.maxAlloc {
			t.Errorf("%s: Check makes %v allocations, want at most %v", c.name, got, c.maxAlloc)
		}
	}
	if observed == 0 {
		t.Error("the observer was not called")
	}
}

// headerSink is a ResponseWriter that keeps only its header map.
type headerSink struct{ h http.Header }

func (w *headerSink) Header() http.Header         { return w.h }
func (w *headerSink) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerSink) WriteHeader(int)             {}

// TestMiddlewareVerdictOnStack: a request with no cost or count rule keeps
// its verdict off the heap (only a metered request's closure needs one):
// the allowed path's allocations are the response headers' values.
func TestMiddlewareVerdictOnStack(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items, which allocates")
	}
	cfg, err := Parse([]byte(`
rules:
  - { name: api, match: { path: /api/ }, limit: 1000000000/s }
  - { name: all, limit: 1000000000/s, algorithm: token_bucket }
`), "weir.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := Middleware(p)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r, _ := http.NewRequest(http.MethodGet, "/api/x", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	w := &headerSink{h: http.Header{}}
	got := testing.AllocsPerRun(200, func() {
		clear(w.h)
		h.ServeHTTP(w, r)
	})
	if got > 6 {
		t.Fatalf("%v allocations per allowed request, want at most 6 (the verdict moved to the heap?)", got)
	}
}
