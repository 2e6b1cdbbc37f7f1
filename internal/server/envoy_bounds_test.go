package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const userRL = "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"

// envoyClient dials a server's gRPC address.
func envoyClient(t *testing.T, addr string) rlspb.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlspb.NewRateLimitServiceClient(conn)
}

// rlDesc builds a descriptor from key, value pairs.
func rlDesc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// decisionSeries returns the weir_decisions_total series of the /metrics
// page at base.
func decisionSeries(t *testing.T, base string) []string {
	t.Helper()
	_, body := call(t, "GET", base+"/metrics", "")
	var out []string
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "weir_decisions_total{") {
			out = append(out, sc.Text())
		}
	}
	return out
}

// TestEnvoyOverrideSeriesBounded: limit overrides with ever new entry keys,
// on gRPC and on POST /v1/check, make one metric series per result and one
// dashboard row per configured domain, never one per request. (Before,
// each distinct set of entry keys made its own label value and a stats
// ring that was never freed.)
func TestEnvoyOverrideSeriesBounded(t *testing.T) {
	s, _, addr := serveEnvoy(t, userRL)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	rl := envoyClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 100 {
		d := rlDesc(fmt.Sprintf("k%d", i), "v", fmt.Sprintf("s%d", i), "w")
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
		if _, err := rl.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{d, d}}); err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf(`{"domain":"rl","descriptors":[{"entries":[{"key":"j%d","value":"v"}],"limit":{"requests_per_unit":5,"unit":"MINUTE"}}]}`, i)
		if resp, b := call(t, "POST", ts.URL+"/v1/check", body, "Content-Type", "application/json"); resp.StatusCode != 200 {
			t.Fatalf("check %d: %d %s", i, resp.StatusCode, b)
		}
	}
	series := decisionSeries(t, ts.URL)
	if len(series) != 2 {
		t.Fatalf("%d weir_decisions_total series, want 2 (allowed and limited of rl.(override)):\n%s", len(series), strings.Join(series, "\n"))
	}
	for _, l := range series {
		if !strings.Contains(l, `rule="rl.(override)"`) {
			t.Fatalf("series %s", l)
		}
	}
	if names := s.stats.names(); len(names) != 1 || names[0] != "rl.(override)" {
		t.Fatalf("stats rows: %v", names)
	}
}

// TestEnvoyOversizedMessage: a gRPC request over the server's message
// bound is refused with ResourceExhausted before it is decoded: nothing is
// decided or counted, not even its descriptors within the limits.
func TestEnvoyOversizedMessage(t *testing.T) {
	s, _, addr := serveEnvoy(t, userRL)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	rl := envoyClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	big := &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{
		rlDesc("user", "alice"), rlDesc("user", strings.Repeat("x", grpcMaxRecv)),
	}}
	if _, err := rl.ShouldRateLimit(ctx, big); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a %d-byte request: %v, want ResourceExhausted", grpcMaxRecv, err)
	}
	if series := decisionSeries(t, ts.URL); len(series) != 0 {
		t.Fatalf("the refused call was counted: %v", series)
	}
	if n := s.metrics.errorsTotal.Load(); n != 0 {
		t.Fatalf("%d store errors", n)
	}
	// alice's counter was not touched: her first call leaves 2 of 3.
	resp, err := rl.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{rlDesc("user", "alice")}})
	if err != nil || resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("after the refused call: %v %v, want 2 remaining", resp, err)
	}
}

// TestGRPCConnectionBounds: the server announces its bounds on one
// connection in its SETTINGS: calls at once and header bytes.
func TestGRPCConnectionBounds(t *testing.T) {
	_, _, addr := serveEnvoy(t, userRL)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var streams, headers atomic.Uint32
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		_ = sf.ForeachSetting(func(s http2.Setting) error {
			switch s.ID {
			case http2.SettingMaxConcurrentStreams:
				streams.Store(s.Val)
			case http2.SettingMaxHeaderListSize:
				headers.Store(s.Val)
			}
			return nil
		})
		break
	}
	if streams.Load() != grpcMaxStreams || headers.Load() != grpcMaxHeaders {
		t.Fatalf("SETTINGS: max concurrent streams %d, max header list %d; want %d and %d", streams.Load(), headers.Load(), grpcMaxStreams, grpcMaxHeaders)
	}
}

// TestInvalidInputIs400: invalid input is a 400 or InvalidArgument on
// every path (by rule and key, Envoy-style JSON, gRPC), and never a store
// error. (Before, an override over ten years reached the store and came
// back 503 / Unavailable, counted as a store error.)
func TestInvalidInputIs400(t *testing.T) {
	s, _, addr := serveEnvoy(t, userRL)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	rl := envoyClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	d := rlDesc("user", "alice")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(11)}
	_, err := rl.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "10 years") {
		t.Fatalf("gRPC, an eleven-year override: %v, want InvalidArgument", err)
	}
	many := make([]*rlcommon.RateLimitDescriptor, 65)
	for i := range many {
		many[i] = rlDesc("user", fmt.Sprint(i))
	}
	_, err = rl.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "rl", Descriptors: many})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "65 descriptors, over the limit of 64") {
		t.Fatalf("gRPC, 65 descriptors: %v, want InvalidArgument", err)
	}

	var sb strings.Builder
	for i := range 65 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"entries":[{"key":"user","value":"%d"}]}`, i)
	}
	for _, c := range []struct{ name, body, want string }{
		{"an eleven-year override", `{"domain":"rl","descriptors":[{"entries":[{"key":"user","value":"a"}],"limit":{"requests_per_unit":5,"unit":"YEAR","unit_multiplier":11}}]}`, "10 years"},
		{"65 descriptors", `{"domain":"rl","descriptors":[` + sb.String() + `]}`, "65 descriptors"},
		{"a cost over the limit", `{"rule":"login","key":"198.51.100.9","hits":4}`, "cost 4"},
		{"a negative cost", `{"rule":"login","key":"198.51.100.9","hits":-1}`, "hits\\\" is -1"},
	} {
		resp, b := call(t, "POST", ts.URL+"/v1/check", c.body, "Content-Type", "application/json")
		if resp.StatusCode != 400 || !strings.Contains(string(b), c.want) {
			t.Errorf("/v1/check, %s: %d %s, want 400 naming %q", c.name, resp.StatusCode, b, c.want)
		}
	}
	if n := s.metrics.errorsTotal.Load(); n != 0 {
		t.Fatalf("%d store errors counted for invalid input", n)
	}
	if series := decisionSeries(t, ts.URL); len(series) != 0 {
		t.Fatalf("invalid input was counted as decisions: %v", series)
	}
}

// TestEnvoyOverridesKeepBoxes: through weir serve's Envoy gRPC API, with a
// memory store of 256 keys, a flood of limit overrides (64 a call) cannot
// release a boxed identity nor one at its limit: an override longer than
// server.envoy_max_override_period (a day by default) is refused, and the
// day-long ones that fill the store evict only state that refuses nothing.
// (Before, year-long overrides were counted and the store evicted the
// state that expires soonest, the box first: the identity boxed for an
// hour was admitted again after a few calls.)
func TestEnvoyOverridesKeepBoxes(t *testing.T) {
	cfg := mustParse(t, `
store: {type: memory, max_keys: 256}
rules:
  - name: login
    match: { path: /login }
    identity: [header:X-User]
    limit: 1/m
    block: 1h
  - name: quota
    match: { path: /quota }
    identity: [header:X-User]
    limit: 1/h
`)
	s, _, addr := serveEnvoy(t, userRL, WithConfig(cfg))
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	rl := envoyClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for _, rule := range []string{"login", "quota"} {
		if _, d := check(t, ts.URL, rule, "mallory", 1); d["allowed"] != true {
			t.Fatalf("%s, first call: %v", rule, d)
		}
		if _, d := check(t, ts.URL, rule, "mallory", 1); d["allowed"] != false {
			t.Fatalf("%s, second call: %v", rule, d)
		}
	}
	flood := func(unit typev3.RateLimitUnit, call int) error {
		descs := make([]*rlcommon.RateLimitDescriptor, 64)
		for i := range descs {
			descs[i] = rlDesc("user", fmt.Sprintf("flood-%d-%d", call, i))
			descs[i].Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: unit}
		}
		_, err := rl.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "rl", Descriptors: descs})
		return err
	}
	err := flood(typev3.RateLimitUnit_YEAR, 0)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "a period of 365d, longer than the 1d") {
		t.Fatalf("a year-long override: %v, want InvalidArgument naming 365d and 1d", err)
	}
	for call := range 100 {
		if err := flood(typev3.RateLimitUnit_DAY, call); err != nil {
			t.Fatalf("day-long overrides, call %d: %v", call, err)
		}
	}
	for _, rule := range []string{"login", "quota"} {
		if _, d := check(t, ts.URL, rule, "mallory", 1); d["allowed"] != false {
			t.Fatalf("%s: admitted after the flood: %v", rule, d)
		}
	}
}

// TestEnvoyMaxOverridePeriodSetting: server.envoy_max_override_period
// lets longer overrides through weir serve, up to its value.
func TestEnvoyMaxOverridePeriodSetting(t *testing.T) {
	_, _, addr := serveEnvoy(t, userRL, WithConfig(mustParse(t, testConfig+"server: {envoy_max_override_period: 365d}\n")))
	rl := envoyClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		mult uint32
		want codes.Code
	}{{1, codes.OK}, {2, codes.InvalidArgument}} {
		d := rlDesc("user", "alice")
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(c.mult)}
		_, err := rl.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		if status.Code(err) != c.want {
			t.Errorf("%d years under a bound of 365d: %v, want %v", c.mult, err, c.want)
		}
	}
}
