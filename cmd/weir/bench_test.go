package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/server"
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
		{"bench", "--target", "grpc", "--descriptors", "0"},
		{"bench", "--target", "grpc", "--descriptors", "65"},
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

// descriptorServer checks that every call carries want descriptors,
// [{client: v}], [{client2: v}], ..., counting the calls that do.
type descriptorServer struct {
	rls.UnimplementedRateLimitServiceServer
	want    int
	matched atomic.Int64
}

func (s *descriptorServer) ShouldRateLimit(_ context.Context, req *rls.RateLimitRequest) (*rls.RateLimitResponse, error) {
	ok := len(req.Descriptors) == s.want
	for i, d := range req.Descriptors {
		ok = ok && len(d.Entries) == 1 && d.Entries[0].Key == descriptorKey(i) && d.Entries[0].Value == req.Descriptors[0].Entries[0].Value
	}
	if ok {
		s.matched.Add(1)
	}
	return &rls.RateLimitResponse{OverallCode: rls.RateLimitResponse_OK}, nil
}

// TestBenchDescriptors: --descriptors N sends N descriptors a call, with
// both gRPC clients.
func TestBenchDescriptors(t *testing.T) {
	for _, client := range grpcClients() {
		for _, n := range []int{1, 5} {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &descriptorServer{want: n}
			gs := grpc.NewServer()
			rls.RegisterRateLimitServiceServer(gs, srv)
			go gs.Serve(ln)
			s := benchJSON(t, "--target", "grpc", "--grpc-client", client, "--addr", ln.Addr().String(), "--concurrency", "4",
				"--requests", "200", "--keys", "20", "--descriptors", strconv.Itoa(n))
			gs.Stop()
			// The probe's call comes on top of the 200.
			if s.Total != 200 || srv.matched.Load() != 201 {
				t.Fatalf("%s, --descriptors %d: %d calls, %d with %d descriptors; want 200 and 201 with the probe", client, n, s.Total, srv.matched.Load(), n)
			}
		}
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

// closedAddr returns a loopback address on which nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestBenchNothingAnswers: against a closed port weir bench stops after its
// first call, prints no figures and exits 1.
func TestBenchNothingAnswers(t *testing.T) {
	addr := closedAddr(t)
	for _, target := range []string{"check", "auth", "grpc"} {
		out, errs, code := runCLI(t, "bench", "--target", target, "--addr", addr, "--duration", "1m", "--quiet")
		if code != 1 || out != "" || !strings.Contains(errs, "nothing was measured") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want 1, nothing, why", target, code, out, errs)
		}
	}
}

// TestBenchMostCallsFail: errors are counted apart from decisions, and a
// run in which most calls failed says so and exits 1.
func TestBenchMostCallsFail(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Key string }
		json.NewDecoder(r.Body).Decode(&in)
		if in.Key != probeKey && in.Key != "k0" {
			http.Error(w, `{"error":"store unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte(`{"allowed":true}`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	args := []string{"bench", "--target", "check", "--addr", srv.URL, "--requests", "100", "--keys", "10", "--concurrency", "2", "--quiet"}
	out, errs, code := runCLI(t, append(args, "--json")...)
	var s benchSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if code != 1 || !s.Failed || s.Total != 100 || s.Errors != 90 || s.Decisions != 10 || s.Allowed != 10 {
		t.Fatalf("exit %d, %+v; want 1, failed, 100 calls = 90 errors + 10 decisions", code, s)
	}
	if s.PerSecond != float64(s.Decisions)/s.Seconds || !strings.Contains(errs, "90 of 100 calls failed") || !strings.Contains(errs, "status 503 store unavailable") {
		t.Fatalf("decisions/s %v over %vs; stderr %q", s.PerSecond, s.Seconds, errs)
	}
	out, _, code = runCLI(t, args...)
	if code != 1 || !strings.Contains(out, "FAILED      90 of 100 calls failed") || !strings.Contains(out, "decisions   10 in") ||
		!strings.Contains(out, "errors      90 (90.0% of calls, not counted as decisions)") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// TestBenchCheck429: a rejection answered 429 (with or without a decision
// in the body) counts as limited, as 200 with allowed: false does.
func TestBenchCheck429(t *testing.T) {
	var n atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) % 3 {
		case 0:
			w.Write([]byte(`{"allowed":false}`))
		case 1:
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"allowed":false}`))
		default:
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"title":"Too Many Requests"}`))
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	s := benchJSON(t, "--target", "check", "--addr", srv.URL, "--requests", "30", "--concurrency", "2")
	if s.Limited != 30 || s.Ruled != 30 || len(s.Warnings) != 0 {
		t.Fatalf("%+v", s)
	}
}

// TestBenchWarnsWhenNoRuleDecides: calls that match no rule are allowed
// without deciding anything; the summary says so.
func TestBenchWarnsWhenNoRuleDecides(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/auth", func(w http.ResponseWriter, r *http.Request) {}) // no rule: 200, no RateLimit-Policy
	srv := httptest.NewServer(mux)
	defer srv.Close()
	out, _, code := runCLI(t, "bench", "--target", "auth", "--addr", srv.URL, "--path", "/nothing", "--requests", "20", "--quiet")
	if code != 0 || !strings.Contains(out, "warning     no call was decided by a rule: no rule matches GET /nothing") {
		t.Fatalf("auth: exit %d:\n%s", code, out)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rls.RegisterRateLimitServiceServer(gs, okServer{})
	go gs.Serve(ln)
	defer gs.Stop()
	for _, client := range grpcClients() {
		out, errs, code := runCLI(t, "bench", "--target", "grpc", "--grpc-client", client, "--addr", ln.Addr().String(), "--requests", "20", "--quiet", "--json")
		if code != 0 || !strings.Contains(errs, `weir bench: warning: no call was decided by a rule: domain "bench" has no rule`) || !strings.Contains(out, `"ruled": 0`) {
			t.Fatalf("grpc %s: exit %d: %s\n%s", client, code, errs, out)
		}
	}
}

// okServer answers every ShouldRateLimit OK with no limit, as a domain
// without rules does.
type okServer struct {
	rls.UnimplementedRateLimitServiceServer
}

func (okServer) ShouldRateLimit(ctx context.Context, req *rls.RateLimitRequest) (*rls.RateLimitResponse, error) {
	return &rls.RateLimitResponse{OverallCode: rls.RateLimitResponse_OK, Statuses: []*rls.RateLimitResponse_DescriptorStatus{{Code: rls.RateLimitResponse_OK}}}, nil
}

// TestBenchDefaultsHitADemoRule: weir bench with no flags but --addr calls
// a rule of weir serve's demo rules, which decides every call. One key, so
// 200 calls outrun its 10/s even when each call takes 100 ms.
func TestBenchDefaultsHitADemoRule(t *testing.T) {
	srv, err := server.New(server.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	s := benchJSON(t, "--addr", hs.URL, "--requests", "200", "--concurrency", "2", "--keys", "1")
	if s.Target != "check" || s.Ruled != 200 || len(s.Warnings) != 0 || s.Limited == 0 {
		t.Fatalf("%+v", s)
	}
}
