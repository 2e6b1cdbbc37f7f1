package policy

import (
	"testing"

	"github.com/weir-dev/weir/store/memstore"
)

func BenchmarkCheck(b *testing.B) {
	p := mustPolicy(b, `
trusted_proxies: [10.0.0.0/8]
deny: [203.0.113.0/24]
rules:
  - {name: per-ip, match: {path: /api/}, identity: ip, limit: 1000000/s}
  - {name: per-key, match: {path: "/api/{x}"}, identity: header:X-API-Key, limit: 1000000/s}
  - {name: login, match: {methods: [POST], path: /login}, limit: 5/m}
`, memstore.New())
	r := req("GET", "/api/items", "X-API-Key", "k1", "X-Forwarded-For", "198.51.100.7")
	r.RemoteAddr = "10.0.0.1:1"
	b.ReportAllocs()
	for b.Loop() {
		if v := p.Check(ctx, r); !v.Allowed {
			b.Fatal("rejected")
		}
	}
}
