package policy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/weir-dev/weir/policy/config"
)

// Any weir.yaml either parses into a Config that New accepts and that
// decides a request, or gets a *config.Error; nothing panics.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"rules:\n  - name: login\n    match: {methods: [POST], path: /api/login}\n    identity: [ip]\n    limit: 5/15m\n    algorithm: sliding_log\n    block: 15m\n",
		"trusted_proxies: [10.0.0.0/8]\nrules:\n  - name: api\n    match: {path: /api/}\n    identity: [header:X-API-Key]\n    tiers:\n      by: header:X-Plan\n      default: {limit: 100/m, algorithm: gcra, burst: 20}\n      pro: {limit: 5000/m}\n",
		"store:\n  type: redis\n  redis: {addrs: [127.0.0.1:1]}\n  on_error: deny\nrules: []\n",
		"allow: [127.0.0.1/32]\ndeny: [{identity: header:X-K, values: [a, b]}]\nrules: []\n",
		"rules:\n  - name: a\n    limit: 1/s\n    identity: [ip/24/64, route, const:x]\n    algorithm: concurrency\n",
		"protect:\n  - name: api\n    match: {path: /api/}\n    concurrency: adaptive\n    max_concurrency: 1000\n    priority: header:X-Priority\n    reserve: 20%\n    max_wait: 20ms\n  - name: pay\n    breaker: {slow_call: 500ms, slow_ratio: 0.5, error_ratio: 0.5, errors: 0, min_requests: 20, window: 10s, open_for: 10s}\nsystem: {max_cpu: 85%, max_inflight: 2000}\n",
		"protect: [{name: a, concurrency: 5, reserve: 0.5, priority: header:P}, {name: b, concurrency: adaptive, min_concurrency: 3}]\n",
		"rules: [{name: x, limit: 0/s}]\n", "rules: x", "", "---\n", "&a [*a]", "rules:\n  - &r {name: a, limit: 1/s}\n  - *r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, "fuzz.yaml")
		if err != nil {
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("Parse error %T %v is not a *config.Error", err, err)
			}
			return
		}
		if cfg.Store.Type == config.StoreRedis {
			return // New needs a Redis store; Parse's validation is what is fuzzed
		}
		p, err := New(cfg, nil, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatalf("Parse accepted the file but New refused it: %v\n%s", err, data)
		}
		req := httptest.NewRequest("POST", "/api/login", nil)
		req.RemoteAddr = "192.0.2.1:1"
		v := p.Check(context.Background(), req)
		_ = v.Release(context.Background())
	})
}
