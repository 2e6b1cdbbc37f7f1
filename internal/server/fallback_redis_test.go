package server

import (
	"context"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weir-dev/weir/internal/redistest"
)

// TestRedisOutageMetricsShowFallbacks: while Redis is down, the metrics,
// the per-second counters and the snapshot say what the on_error fallback
// decided, and which fallback it was, on /v1/check and on Envoy's gRPC
// alike: with local and a 3/m rule, 5 requests are 3 allowed and 2
// limited, not 5 errors; with allow, 5 allowed. The store failures are
// counted apart.
func TestRedisOutageMetricsShowFallbacks(t *testing.T) {
	for _, c := range []struct {
		mode             string
		allowed, limited int
	}{{"local", 3, 2}, {"allow", 5, 0}} {
		t.Run(c.mode, func(t *testing.T) {
			r := redistest.Standalone(t)
			cfg := mustParse(t, "store: {timeout: 500ms, on_error: "+c.mode+"}\nrules:\n  - {name: login, limit: 3/m, algorithm: sliding_log}\n")
			dir := t.TempDir()
			rl := "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
			if err := os.WriteFile(filepath.Join(dir, "rl.yaml"), []byte(rl), 0o644); err != nil {
				t.Fatal(err)
			}
			s, err := New(WithConfig(cfg), WithRedisURL("redis://"+r.Addr), WithEnvoyConfigDir(dir), WithLogger(quietLogger()), WithAdminToken(""))
			if err != nil {
				t.Fatal(err)
			}
			hl, _ := net.Listen("tcp", "127.0.0.1:0")
			gl, _ := net.Listen("tcp", "127.0.0.1:0")
			sctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Serve(sctx, hl, gl) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			})
			base := "http://" + hl.Addr().String()

			r.Stop() // the outage

			allowed := 0
			for range 5 {
				code, d := check(t, base, "login", "192.0.2.9", 1)
				if code != map[bool]int{true: 200, false: 429}[d["allowed"] == true] || d["fallback"] != c.mode {
					t.Fatalf("/v1/check: %d %v", code, d)
				}
				if d["allowed"] == true {
					allowed++
				}
			}
			conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer ccancel()
			req := &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}}
			envoyOK := 0
			for range 5 {
				resp, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, req)
				if err != nil {
					t.Fatalf("gRPC during the outage: %v", err)
				}
				if resp.OverallCode == rlspb.RateLimitResponse_OK {
					envoyOK++
				}
			}
			if allowed != c.allowed || envoyOK != c.allowed {
				t.Fatalf("admitted %d on /v1/check and %d on gRPC, want %d", allowed, envoyOK, c.allowed)
			}

			_, b := call(t, "GET", base+"/metrics", "")
			m := string(b)
			for _, rule := range []string{"login", "rl.user"} {
				want := []string{`weir_decisions_total{result="allowed",rule="` + rule + `"} ` + strconv.Itoa(c.allowed),
					`weir_fallback_decisions_total{fallback="` + c.mode + `",result="allowed",rule="` + rule + `"} ` + strconv.Itoa(c.allowed)}
				if c.limited > 0 {
					want = append(want, `weir_decisions_total{result="limited",rule="`+rule+`"} `+strconv.Itoa(c.limited),
						`weir_fallback_decisions_total{fallback="`+c.mode+`",result="limited",rule="`+rule+`"} `+strconv.Itoa(c.limited))
				}
				for _, w := range want {
					if !strings.Contains(m, w) {
						t.Errorf("metrics lack %s", w)
					}
				}
			}
			if strings.Contains(m, `result="error"`) || !strings.Contains(m, "weir_store_errors_total 10") {
				t.Errorf("want no error decisions and 10 store errors")
			}
			if t.Failed() {
				t.Fatalf("metrics:\n%s", grepLines(m, "weir_"))
			}

			// The series holds complete seconds: wait for this one to end.
			var snap Snapshot
			eventually(t, 30*time.Second, "the snapshot to count the fallback decisions", func() bool {
				snap = s.snapshot(httptest.NewRequest("GET", "/v1/dashboard/snapshot", nil))
				return sum(snap.Series.Total.Fallback) == 10
			})
			if snap.Store.Fallback != c.mode || snap.Store.FallbackDecisionsTotal != 10 || snap.Store.ErrorsTotal != 10 {
				t.Fatalf("snapshot store: %+v", snap.Store)
			}
			for _, rule := range []string{"login", "rl.user"} {
				sc := snap.Series.Rules[rule]
				if sc == nil || sum(sc.Allowed) != int64(c.allowed) || sum(sc.Limited) != int64(c.limited) || sum(sc.Fallback) != 5 {
					t.Fatalf("snapshot series %s: allowed %d, limited %d, fallback %d; want %d, %d, 5", rule, sum(sc.Allowed), sum(sc.Limited), sum(sc.Fallback), c.allowed, c.limited)
				}
			}
		})
	}
}
