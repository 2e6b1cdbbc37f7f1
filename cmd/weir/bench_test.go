package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// limitedServer answers ShouldRateLimit with a real weir limiter: 5 per
// hour per descriptor value, so abusive keys are soon over the limit.
type limitedServer struct {
	rls.UnimplementedRateLimitServiceServer
	lim *weir.Limiter
}

var benchLimit = weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: time.Hour}

func (s *limitedServer) ShouldRateLimit(ctx context.Context, req *rls.RateLimitRequest) (*rls.RateLimitResponse, error) {
	key := req.Descriptors[0].Entries[0].Value
	r, err := s.lim.Allow(ctx, key, benchLimit)
	if err != nil {
		return nil, err
	}
	code := rls.RateLimitResponse_OK
	if !r.Allowed {
		code = rls.RateLimitResponse_OVER_LIMIT
	}
	return &rls.RateLimitResponse{OverallCode: code}, nil
}

func benchJSON(t *testing.T, args ...string) benchSummary {
	t.Helper()
	out, errs, code := runCLI(t, append([]string{"bench", "--json", "--quiet"}, args...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var s benchSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("summary is not JSON: %v\n%s", err, out)
	}
	if s.Total != s.Allowed+s.Limited+s.Errors || s.Errors != 0 {
		t.Fatalf("inconsistent summary: %+v", s)
	}
	if s.LatencyMS["p50"] <= 0 || s.LatencyMS["p50"] > s.LatencyMS["p99"] || s.LatencyMS["p99"] > s.LatencyMS["max"] {
		t.Fatalf("latency quantiles out of order: %v", s.LatencyMS)
	}
	return s
}

func TestBenchGRPC(t *testing.T) {
	for _, client := range grpcClients() {
		t.Run(client, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			gs := grpc.NewServer()
			rls.RegisterRateLimitServiceServer(gs, &limitedServer{lim: weir.NewLimiter(memstore.New())})
			go gs.Serve(ln)
			defer gs.Stop()

			s := benchJSON(t, "--target", "grpc", "--grpc-client", client, "--addr", ln.Addr().String(), "--concurrency", "8", "--connections", "2",
				"--requests", "2000", "--keys", "1000", "--dist", "zipf", "--abusive", "0.2", "--abusive-keys", "3")
			if s.Total != 2000 || s.Connections != 2 {
				t.Fatalf("total %d over %d connections, want 2000 over 2", s.Total, s.Connections)
			}
			// Each of the 3 abusive keys is admitted 5 times; ~400 abusive
			// requests means most of them are limited.
			if s.Limited < 300 {
				t.Fatalf("only %d limited with 20%% abusive traffic", s.Limited)
			}
		})
	}
}

func TestBenchHTTPTargets(t *testing.T) {
	lim := weir.NewLimiter(memstore.New())
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Rule, Key string
			Hits      int64
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Rule != "demo-ip" {
			http.Error(w, `{"error":"bad request"}`, 400)
			return
		}
		res, _ := lim.AllowN(r.Context(), in.Key, benchLimit, in.Hits)
		json.NewEncoder(w).Encode(map[string]any{"allowed": res.Allowed})
	})
	mux.HandleFunc("GET /v1/auth", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Original-URI") != "/api" || !strings.HasPrefix(r.Header.Get("X-Real-IP"), "198.") {
			w.WriteHeader(500)
			return
		}
		res, _ := lim.Allow(r.Context(), "auth:"+r.Header.Get("X-Real-IP"), benchLimit)
		if !res.Allowed {
			w.WriteHeader(http.StatusForbidden)
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	s := benchJSON(t, "--target", "check", "--addr", srv.URL, "--concurrency", "4", "--requests", "300", "--keys", "10")
	if s.Total != 300 || s.Allowed != 50 || s.Limited != 250 {
		t.Fatalf("check: %d total, %d allowed, %d limited; want 300, 50 (10 keys × 5), 250", s.Total, s.Allowed, s.Limited)
	}
	s = benchJSON(t, "--target", "auth", "--addr", strings.TrimPrefix(srv.URL, "http://"), "--path", "/api", "--concurrency", "4", "--duration", "300ms", "--keys", "3")
	if s.Total == 0 || s.Allowed > 15 {
		t.Fatalf("auth: %+v (3 keys × 5 may pass)", s)
	}
}

// TestBenchPaced: --rate paces the callers; a run of 30 requests at a
// rate far above what the machine needs still makes exactly 30.
func TestBenchPaced(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"allowed":true}`)) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	s := benchJSON(t, "--target", "check", "--addr", srv.URL, "--requests", "30", "--concurrency", "3", "--rate", "2000")
	if s.Total != 30 || s.Allowed != 30 {
		t.Fatalf("%+v", s)
	}
}

func TestBenchReadableSummary(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"allowed":true}`)) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	out, _, code := runCLI(t, "bench", "--target", "check", "--addr", srv.URL, "--requests", "50", "--concurrency", "2", "--quiet")
	if code != 0 || !strings.Contains(out, "decisions") || !strings.Contains(out, "p99.9") || !strings.Contains(out, "█") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--target", "udp"},
		{"bench", "--concurrency", "0"},
		{"bench", "--abusive", "1.5"},
		{"bench", "--dist", "pareto"},
		{"bench", "--dist", "zipf", "--zipf-s", "1"},
		{"bench", "--duration", "0s"},
		{"bench", "--rate", "-5"},
		{"bench", "--grpc-client", "grpc-java"},
	} {
		if _, errs, code := runCLI(t, args...); code != 2 || errs == "" {
			t.Errorf("%v: exit %d %q, want 2 with a message", args, code, errs)
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	h := newHistogram()
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{.5, 500 * time.Microsecond}, {.99, 990 * time.Microsecond}} {
		got := h.quantile(c.q)
		if got < c.want || float64(got) > float64(c.want)*1.13 {
			t.Errorf("q%.2f = %v, want within 12%% above %v", c.q, got, c.want)
		}
	}
	if h.quantile(1) != time.Millisecond {
		t.Errorf("max = %v", h.quantile(1))
	}
}

// TestBenchGRPCClients: weir bench --target grpc counts every decision
// exactly with either client, whether each caller has its own connection
// or callers share them.
func TestBenchGRPCClients(t *testing.T) {
	for _, client := range grpcClients() {
		for _, conns := range []int{4, 2} {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			gs := grpc.NewServer()
			rls.RegisterRateLimitServiceServer(gs, &limitedServer{lim: weir.NewLimiter(memstore.New())})
			go gs.Serve(ln)
			s := benchJSON(t, "--target", "grpc", "--grpc-client", client, "--addr", ln.Addr().String(), "--concurrency", "4", "--connections", strconv.Itoa(conns),
				"--requests", "600", "--keys", "20", "--abusive", "0")
			gs.Stop()
			if s.Total != 600 || s.Allowed != 100 || s.Limited != 500 || s.GRPCClient != client || s.Connections != conns {
				t.Fatalf("%s over %d connections: %+v; want 600 = 100 allowed (20 keys × 5) + 500 limited", client, conns, s)
			}
		}
	}
	if _, errs, code := runCLI(t, "bench", "--grpc-client", "grpc-java"); code != 2 || !strings.Contains(errs, `--grpc-client "grpc-java"`) {
		t.Fatalf("exit %d: %s", code, errs)
	}
}

// grpcClients are the --grpc-client values this build of weir has: lean
// only with the bench tag (go test -tags bench ./cmd/weir).
func grpcClients() []string {
	if leanClient == nil {
		return []string{"grpc-go"}
	}
	return []string{"lean", "grpc-go"}
}

// TestBenchGRPCClientDefault: --grpc-client defaults to lean where it is
// built in, else to grpc-go; asked for where it is not, lean is a usage
// error that names the bench tag.
func TestBenchGRPCClientDefault(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rls.RegisterRateLimitServiceServer(gs, &limitedServer{lim: weir.NewLimiter(memstore.New())})
	go gs.Serve(ln)
	defer gs.Stop()
	s := benchJSON(t, "--target", "grpc", "--addr", ln.Addr().String(), "--concurrency", "2", "--requests", "100", "--keys", "10", "--abusive", "0")
	want := "grpc-go"
	if leanClient != nil {
		want = "lean"
	}
	if s.GRPCClient != want || s.Total != 100 {
		t.Fatalf("default client %q, %d calls; want %q, 100", s.GRPCClient, s.Total, want)
	}
	if leanClient != nil {
		return
	}
	_, errs, code := runCLI(t, "bench", "--target", "grpc", "--grpc-client", "lean", "--requests", "1")
	if code != 2 || !strings.Contains(errs, "-tags bench") {
		t.Fatalf("--grpc-client lean without the bench tag: exit %d: %s", code, errs)
	}
}
