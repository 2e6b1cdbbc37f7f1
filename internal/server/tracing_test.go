package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/weir-dev/weir/internal/otelsetup"
	"github.com/weir-dev/weir/internal/otlptest"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/redisstore"
	"github.com/weir-dev/weir/weirotel"
)

// Trace and span IDs of the callers' own spans, sent as traceparent.
const (
	callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	httpParent  = "00f067aa0ba902b7"
	authParent  = "00f067aa0ba902b8"
	grpcParent  = "00f067aa0ba902b9"
)

func traceparent(span string) string { return "00-" + callerTrace + "-" + span + "-01" }

// tracingFromEnv points the OTEL_* environment at rc and builds tracing
// from it, as weir serve does.
func tracingFromEnv(t *testing.T, rc *otlptest.Receiver, protocol string) *weirotel.Tracing {
	t.Helper()
	env := map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": rc.Endpoint,
		"OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
		"OTEL_EXPORTER_OTLP_INSECURE": "true",
		"OTEL_BSP_SCHEDULE_DELAY":     "50",
		"OTEL_SERVICE_NAME":           "weir-under-test",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	tr, shutdown, err := otelsetup.FromEnv(context.Background(), lookup)
	if err != nil || tr == nil {
		t.Fatalf("FromEnv: %v, %v", tr, err)
	}
	t.Cleanup(func() { shutdown(context.Background()) })
	return tr
}

// TestTracingOTLP: with OTEL_* set, every check is a span, a child of the
// caller's W3C trace context, carrying the rule, tier, allowed and
// fallback; each store call is a child span of its check. Over OTLP/HTTP
// and OTLP/gRPC, to a receiver in the test, on the memory store and on
// Redis.
func TestTracingOTLP(t *testing.T) {
	for _, run := range []struct{ protocol, store string }{{"http/protobuf", "memory"}, {"grpc", "memory"}, {"http/protobuf", "redis"}} {
		protocol := run.protocol
		t.Run(protocol+"/"+run.store, func(t *testing.T) {
			var rc *otlptest.Receiver
			if protocol == "grpc" {
				rc = otlptest.NewGRPC(t)
			} else {
				rc = otlptest.NewHTTP(t)
			}
			tr := tracingFromEnv(t, rc, protocol)
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "rl.yaml"), []byte("domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644)
			cfg := mustParse(t, testConfig)
			if run.store == "redis" {
				cfg.Store.Type = config.StoreRedis
				cfg.Store.Redis.Addrs = []string{redistest.Standalone(t).Addr}
				cfg.Store.Timeout = 10 * time.Second // a loaded machine must not hand decisions to on_error
			}
			s, err := New(WithConfig(cfg), WithEnvoyConfigDir(dir), WithLogger(quietLogger()), WithAdminToken(""), WithTracing(tr))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if rs, ok := s.store.(*redisstore.Store); ok {
				eventually(t, 20*time.Second, "Redis to connect", rs.Connected)
			}
			haddr, gaddr := serveListeners(t, s)
			ts := "http://" + haddr

			// /v1/check: the tiered rule at its pro tier, with a traceparent.
			body := `{"rule":"tiered","key":"k1","hits":1,"tier":"pro"}`
			req, _ := http.NewRequest("POST", ts+"/v1/check", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("traceparent", traceparent(httpParent))
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("check: %v %v", resp, err)
			}
			resp.Body.Close()

			// /v1/auth: the api rule, limited after 5.
			for i := 0; i < 6; i++ {
				req, _ = http.NewRequest("GET", ts+"/v1/auth", nil)
				req.Header.Set("X-Original-URI", "/api/items")
				req.Header.Set("X-Original-Method", "GET")
				req.Header.Set("X-API-Key", "trace-key")
				if i == 5 {
					req.Header.Set("traceparent", traceparent(authParent))
				}
				resp, err = http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			if resp.StatusCode == 200 {
				t.Fatalf("sixth auth request allowed")
			}

			// gRPC ShouldRateLimit with traceparent metadata.
			conn, err := grpc.NewClient(gaddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent(grpcParent))
			_, err = rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "rl",
				Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}})
			if err != nil {
				t.Fatal(err)
			}

			find := func(spans []otlptest.Span, name, parent string) *otlptest.Span {
				for i := range spans {
					if spans[i].Name == name && spans[i].Parent == parent && spans[i].TraceID == callerTrace {
						return &spans[i]
					}
				}
				return nil
			}
			childOf := func(spans []otlptest.Span, parent *otlptest.Span) *otlptest.Span {
				for i := range spans {
					if spans[i].Parent == parent.SpanID && spans[i].TraceID == parent.TraceID && strings.HasPrefix(spans[i].Name, "weir.store.") {
						return &spans[i]
					}
				}
				return nil
			}
			spans := rc.WaitFor(t, "the three check spans and their store spans", func(spans []otlptest.Span) bool {
				for _, c := range []struct{ name, parent string }{{"weir.check", httpParent}, {"weir.auth", authParent}, {"weir.grpc", grpcParent}} {
					sp := find(spans, c.name, c.parent)
					if sp == nil || childOf(spans, sp) == nil {
						return false
					}
				}
				return true
			})
			check := find(spans, "weir.check", httpParent)
			if check.Attrs["weir.rule"] != "tiered" || check.Attrs["weir.tier"] != "pro" || check.Attrs["weir.allowed"] != true || check.Service != "weir-under-test" {
				t.Errorf("check span: %+v", *check)
			}
			if st := childOf(spans, check); st.Attrs["weir.hits"] != int64(1) || st.Attrs["weir.allowed"] != true {
				t.Errorf("check's store span: %+v", *st)
			}
			auth := find(spans, "weir.auth", authParent)
			if auth.Attrs["weir.rule"] != "api" || auth.Attrs["weir.allowed"] != false {
				t.Errorf("auth span: %+v", *auth)
			}
			g := find(spans, "weir.grpc", grpcParent)
			if g.Attrs["weir.rule"] != "rl.user" || g.Attrs["weir.allowed"] != true {
				t.Errorf("gRPC span: %+v", *g)
			}
			for _, sp := range spans {
				if _, ok := sp.Attrs["weir.key"]; ok || strings.Contains(sp.Name, "trace-key") {
					t.Errorf("a span carries an identity: %+v", sp)
				}
			}
		})
	}
}
