package envoyrls

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// clock is a settable clock shared by the store and the service.
type clock struct{ ns atomic.Int64 }

// base is midnight UTC of some day, plus 17.25 s: a second's window has
// 0.75 s left, a minute's 42.75 s, an hour's 3582.75 s.
var base = time.Unix(1_800_000_000/86400*86400, 0).Add(17*time.Second + 250*time.Millisecond)

func newClock() *clock {
	c := &clock{}
	c.ns.Store(base.UnixNano())
	return c
}

func (c *clock) Now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) Add(d time.Duration) { c.ns.Add(int64(d)) }
func (c *clock) String() string      { return c.Now().Sub(base).String() }

// harness is a Service behind a real gRPC server on a loopback port, with
// a real client playing Envoy.
type harness struct {
	t      *testing.T
	svc    *Service
	clk    *clock
	store  *memstore.Store
	client rlspb.RateLimitServiceClient
	conn   *grpc.ClientConn
}

func start(t *testing.T, cfg *Config, opts ...Option) *harness {
	t.Helper()
	h := &harness{t: t, clk: newClock()}
	h.store = memstore.New(memstore.WithClock(h.clk.Now))
	h.svc = New(cfg, h.store, append([]Option{WithClock(h.clk.Now)}, opts...)...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	RegisterGRPC(gs, h.svc)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	h.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.conn.Close() })
	h.client = rlspb.NewRateLimitServiceClient(h.conn)
	return h
}

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	cfg, err := Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// withHits sets a descriptor's own hits_addend.
func withHits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func request(domain string, hits uint32, descs ...*rlcommon.RateLimitDescriptor) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: domain, Descriptors: descs, HitsAddend: hits}
}

func (h *harness) call(req *rlspb.RateLimitRequest) *rlspb.RateLimitResponse {
	h.t.Helper()
	resp, err := h.client.ShouldRateLimit(context.Background(), req)
	if err != nil {
		h.t.Fatalf("ShouldRateLimit(%v): %v", prototext.Format(req), err)
	}
	return resp
}

// expect calls and compares the whole response.
func (h *harness) expect(req *rlspb.RateLimitRequest, want *rlspb.RateLimitResponse) {
	h.t.Helper()
	got := h.call(req)
	if !proto.Equal(got, want) {
		h.t.Fatalf("at +%v, request\n%v\ngot  %v\nwant %v", h.clk, prototext.Format(req), prototext.Format(got), prototext.Format(want))
	}
}

const (
	ok   = rlspb.RateLimitResponse_OK
	over = rlspb.RateLimitResponse_OVER_LIMIT
	sec  = rlspb.RateLimitResponse_RateLimit_SECOND
	min_ = rlspb.RateLimitResponse_RateLimit_MINUTE
	hour = rlspb.RateLimitResponse_RateLimit_HOUR
)

func resp(code rlspb.RateLimitResponse_Code, st ...*rlspb.RateLimitResponse_DescriptorStatus) *rlspb.RateLimitResponse {
	return &rlspb.RateLimitResponse{OverallCode: code, Statuses: st}
}

// st is a status with a limit.
func st(code rlspb.RateLimitResponse_Code, rpu uint32, unit rlspb.RateLimitResponse_RateLimit_Unit, remaining uint32, reset time.Duration) *rlspb.RateLimitResponse_DescriptorStatus {
	return &rlspb.RateLimitResponse_DescriptorStatus{
		Code:               code,
		CurrentLimit:       &rlspb.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit},
		LimitRemaining:     remaining,
		DurationUntilReset: durationpb.New(reset),
	}
}

func named(s *rlspb.RateLimitResponse_DescriptorStatus, name string) *rlspb.RateLimitResponse_DescriptorStatus {
	s.CurrentLimit.Name = name
	return s
}

// noLimit is the status of a descriptor no rule applies to.
func noLimit() *rlspb.RateLimitResponse_DescriptorStatus {
	return &rlspb.RateLimitResponse_DescriptorStatus{Code: ok}
}

// unlimited is the status of an unlimited rule.
func unlimited() *rlspb.RateLimitResponse_DescriptorStatus {
	return &rlspb.RateLimitResponse_DescriptorStatus{Code: ok, LimitRemaining: math.MaxUint32}
}

// The two files of envoyproxy/ratelimit's integration test.
const basicYAML = `
domain: basic
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
`

const anotherYAML = `
domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 10
`

func integrationConfig(t *testing.T) *Config {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{"basic.yaml": basicYAML, "another.yml": anotherYAML, "notes.txt": "not yaml", ".hidden.yaml": "broken: ["} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestUnknownDomainIsOK(t *testing.T) {
	h := start(t, integrationConfig(t))
	h.expect(request("foo", 1, desc("hello", "world")), resp(ok, noLimit()))
	// A limit override does not apply in an unknown domain either.
	d := desc("hello", "world")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
	h.expect(request("foo", 1, d), resp(ok, noLimit()))
}

func TestPerSecondLimit(t *testing.T) {
	h := start(t, integrationConfig(t))
	for i := range 50 {
		h.expect(request("basic", 1, desc("key1", "foo")), resp(ok, st(ok, 50, sec, uint32(49-i), time.Second)))
	}
	h.expect(request("basic", 1, desc("key1", "foo")), resp(over, st(over, 50, sec, 0, time.Second)))
	// Another value of key1 has its own counter.
	h.expect(request("basic", 1, desc("key1", "bar")), resp(ok, st(ok, 50, sec, 49, time.Second)))
	// The next second starts a new window.
	h.clk.Add(750 * time.Millisecond)
	h.expect(request("basic", 1, desc("key1", "foo")), resp(ok, st(ok, 50, sec, 49, time.Second)))
}

func TestPerMinuteLimit(t *testing.T) {
	h := start(t, integrationConfig(t))
	// As upstream's integration test: 25 calls against 20 per minute.
	for i := range 25 {
		code, remaining := ok, uint32(20-(i+1))
		if i >= 20 {
			code, remaining = over, 0
		}
		h.expect(request("another", 1, desc("key2", "1234")), resp(code, st(code, 20, min_, remaining, 43*time.Second)))
	}
	h.clk.Add(40 * time.Second) // 2.75 s of the window left: reported as 3 s, as upstream
	h.expect(request("another", 1, desc("key2", "1234")), resp(over, st(over, 20, min_, 0, 3*time.Second)))
	h.clk.Add(3 * time.Second)
	h.expect(request("another", 1, desc("key2", "1234")), resp(ok, st(ok, 20, min_, 19, 60*time.Second)))
	// one_per_minute: the second call is over.
	h.expect(request("basic", 0, desc("one_per_minute", "x")), resp(ok, st(ok, 1, min_, 0, 60*time.Second)))
	h.expect(request("basic", 0, desc("one_per_minute", "x")), resp(over, st(over, 1, min_, 0, 60*time.Second)))
}

func TestTwoDescriptorsCountIndependently(t *testing.T) {
	h := start(t, integrationConfig(t))
	// As upstream's integration test: key2 keeps counting after key3 is over.
	for i := range 15 {
		code := ok
		remaining1, remaining2 := uint32(20-(i+1)), uint32(10-(i+1))
		if i >= 10 {
			code, remaining2 = over, 0
		}
		h.expect(request("another", 1, desc("key2", "42"), desc("key3", "42")),
			resp(code, st(ok, 20, min_, remaining1, 43*time.Second), st(code, 10, hour, remaining2, 3583*time.Second)))
	}
}

// envoyproxy/ratelimit's examples/ratelimit/config/example.yaml.
const exampleYAML = `---
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 1
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: bar
        value: banned
        rate_limit:
          unit: minute
          requests_per_unit: 0
      - key: baz
        rate_limit:
          unit: second
          requests_per_unit: 1
      - key: bay
        rate_limit:
          unlimited: true
      - key: baz
        value: shady
        rate_limit:
          unit: minute
          requests_per_unit: 1
        shadow_mode: true
  - key: qux
    rate_limit:
      unlimited: true
`

func TestUpstreamExample(t *testing.T) {
	var mu sync.Mutex
	var seen []Observation
	h := start(t, mustParse(t, exampleYAML), WithObserver(func(_ context.Context, d Observation) {
		mu.Lock()
		seen = append(seen, d)
		mu.Unlock()
	}))
	// /test: source_cluster + destination_cluster, 1 per minute.
	h.expect(request("rl", 0, desc("source_cluster", "proxy", "destination_cluster", "mock")), resp(ok, st(ok, 1, min_, 0, 43*time.Second)))
	h.expect(request("rl", 0, desc("source_cluster", "proxy", "destination_cluster", "mock")), resp(over, st(over, 1, min_, 0, 43*time.Second)))
	h.expect(request("rl", 0, desc("source_cluster", "other", "destination_cluster", "mock")), resp(ok, noLimit()))
	// /header: foo, 2 per minute.
	h.expect(request("rl", 0, desc("foo", "foo")), resp(ok, st(ok, 2, min_, 1, 43*time.Second)))
	// /twoheader: foo+bar 3 per minute and foo+baz 1 per second.
	h.expect(request("rl", 0, desc("foo", "foo", "bar", "bar"), desc("foo", "foo", "baz", "baz")),
		resp(ok, st(ok, 3, min_, 2, 43*time.Second), st(ok, 1, sec, 0, time.Second)))
	h.expect(request("rl", 0, desc("foo", "foo", "bar", "bar"), desc("foo", "foo", "baz", "baz")),
		resp(over, st(ok, 3, min_, 1, 43*time.Second), st(over, 1, sec, 0, time.Second)))
	// bar=banned: requests_per_unit 0 blocks everything.
	h.expect(request("rl", 0, desc("foo", "foo", "bar", "banned")), resp(over, st(over, 0, min_, 0, 43*time.Second)))
	// bay and qux are unlimited.
	h.expect(request("rl", 0, desc("foo", "foo", "bay", "x"), desc("qux", "y")), resp(ok, unlimited(), unlimited()))
	// baz=shady is in shadow mode: over the limit, yet OK.
	h.expect(request("rl", 0, desc("foo", "foo", "baz", "shady")), resp(ok, st(ok, 1, min_, 0, 43*time.Second)))
	h.expect(request("rl", 0, desc("foo", "foo", "baz", "shady")), resp(ok, st(ok, 1, min_, 0, 43*time.Second)))
	// baz=not-so-shady gets the default baz rule.
	h.expect(request("rl", 0, desc("foo", "foo", "baz", "not-so-shady")), resp(ok, st(ok, 1, sec, 0, time.Second)))
	h.expect(request("rl", 0, desc("foo", "foo", "baz", "not-so-shady")), resp(over, st(over, 1, sec, 0, time.Second)))

	mu.Lock()
	defer mu.Unlock()
	var shadow []Observation
	for _, d := range seen {
		if d.Outcome == ShadowLimited {
			shadow = append(shadow, d)
		}
	}
	if len(shadow) != 1 || shadow[0].Rule != "rl.foo.baz_shady" || shadow[0].Result.Allowed {
		t.Fatalf("shadow decisions = %+v, want one for rl.foo.baz_shady", shadow)
	}
	outcomes := map[Outcome]int{}
	for _, d := range seen {
		outcomes[d.Outcome]++
	}
	want := map[Outcome]int{Allowed: 7, Limited: 4, ShadowLimited: 1, Unlimited: 2, NoLimit: 1}
	for o, n := range want {
		if outcomes[o] != n {
			t.Errorf("%v decisions = %d, want %d (all: %v)", o, outcomes[o], n, outcomes)
		}
	}
}

// README example 4: the request must be exactly as deep as the tree.
func TestDepthMustMatch(t *testing.T) {
	h := start(t, mustParse(t, `
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 300, unit: second}
  - key: nested
    descriptors:
      - key: subkey
        rate_limit: {requests_per_unit: 300, unit: second}
`))
	h.expect(request("example4", 0, desc("key", "value", "subkey", "subvalue")), resp(ok, noLimit()))
	h.expect(request("example4", 0, desc("nested", "x")), resp(ok, noLimit()))
	h.expect(request("example4", 0, desc("nested", "x", "subkey", "y", "more", "z")), resp(ok, noLimit()))
	h.expect(request("example4", 0, desc("nested", "x", "subkey", "y")), resp(ok, st(ok, 300, sec, 299, time.Second)))
	h.expect(request("example4", 0, desc("key", "value")), resp(ok, st(ok, 300, sec, 299, time.Second)))
	h.expect(request("example4", 0, desc()), resp(ok, noLimit()))
}

// README example 7.
const replacesYAML = `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
  - key: free
    rate_limit:
      unlimited: true
      replaces: [{name: specific_limit}]
`

func TestReplaces(t *testing.T) {
	h := start(t, mustParse(t, replacesYAML))
	first := desc("key_1", "value_1", "user", "bkthomps")
	second := desc("key_2", "value_2", "user", "bkthomps")
	for i := range 3 {
		h.expect(request("example7", 0, first, second), resp(ok, noLimit(), st(ok, 10, sec, uint32(9-i), time.Second)))
	}
	// The replaced rule's counter was not touched.
	h.expect(request("example7", 0, first), resp(ok, named(st(ok, 5, sec, 4, time.Second), "specific_limit")))
	// An unlimited rule replaces too.
	h.expect(request("example7", 0, desc("free", "x"), first), resp(ok, unlimited(), noLimit()))
	h.expect(request("example7", 0, first), resp(ok, named(st(ok, 5, sec, 3, time.Second), "specific_limit")))
}

func TestWildcards(t *testing.T) {
	// envoyproxy/ratelimit's test/config/wildcard.yaml, plus precedence and
	// nesting cases.
	h := start(t, mustParse(t, `
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noVal
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: k
    value: abc
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: ab*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    value: a*
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /api/*
    descriptors:
      - key: method
        value: P*
        rate_limit: {unit: minute, requests_per_unit: 7}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`))
	// Each value matching the wildcard has its own counter.
	h.expect(request("test-domain", 0, desc("wild", "foo1")), resp(ok, st(ok, 20, min_, 19, 43*time.Second)))
	h.expect(request("test-domain", 0, desc("wild", "foo2")), resp(ok, st(ok, 20, min_, 19, 43*time.Second)))
	h.expect(request("test-domain", 0, desc("wild", "foo")), resp(ok, st(ok, 20, min_, 19, 43*time.Second)))
	h.expect(request("test-domain", 0, desc("wild", "bar")), resp(ok, noLimit()))
	h.expect(request("test-domain", 0, desc("noWild", "foo1")), resp(ok, noLimit()))
	h.expect(request("test-domain", 0, desc("noVal", "foo1")), resp(ok, st(ok, 20, min_, 19, 43*time.Second)))
	h.expect(request("test-domain", 0, desc("midWild", "barab")), resp(ok, noLimit()))
	// Exact, then the first wildcard in file order, then the key alone.
	h.expect(request("test-domain", 0, desc("k", "abc")), resp(ok, st(ok, 1, min_, 0, 43*time.Second)))
	h.expect(request("test-domain", 0, desc("k", "abd")), resp(ok, st(ok, 2, min_, 1, 43*time.Second)))
	h.expect(request("test-domain", 0, desc("k", "axe")), resp(ok, st(ok, 4, min_, 3, 43*time.Second)))
	h.expect(request("test-domain", 0, desc("k", "xyz")), resp(ok, st(ok, 3, min_, 2, 43*time.Second)))
	// Wildcards at a nested level.
	h.expect(request("test-domain", 0, desc("path", "/api/users", "method", "POST")), resp(ok, st(ok, 7, min_, 6, 43*time.Second)))
	h.expect(request("test-domain", 0, desc("path", "/api/users", "method", "GET")), resp(ok, noLimit()))
	h.expect(request("test-domain", 0, desc("path", "/web", "method", "POST")), resp(ok, noLimit()))
	// share_threshold: every value under files/* shares one counter.
	h.expect(request("test-domain", 0, desc("files", "files/a.pdf")), resp(ok, st(ok, 2, min_, 1, 43*time.Second)))
	h.expect(request("test-domain", 0, desc("files", "files/b.csv")), resp(ok, st(ok, 2, min_, 0, 43*time.Second)))
	h.expect(request("test-domain", 0, desc("files", "files/c.txt")), resp(over, st(over, 2, min_, 0, 43*time.Second)))
}

func TestHitsAddend(t *testing.T) {
	h := start(t, integrationConfig(t))
	key := func() *rlcommon.RateLimitDescriptor { return desc("key2", "hits") }
	// Request level: 0 counts as 1, others count as given.
	h.expect(request("another", 0, key()), resp(ok, st(ok, 20, min_, 19, 43*time.Second)))
	h.expect(request("another", 5, key()), resp(ok, st(ok, 20, min_, 14, 43*time.Second)))
	// Descriptor level overrides request level.
	h.expect(request("another", 5, withHits(key(), 3)), resp(ok, st(ok, 20, min_, 11, 43*time.Second)))
	// Descriptor level 0 checks without counting.
	h.expect(request("another", 5, withHits(key(), 0)), resp(ok, st(ok, 20, min_, 11, 43*time.Second)))
	h.expect(request("another", 0, withHits(key(), 0), key()), resp(ok, st(ok, 20, min_, 11, 43*time.Second), st(ok, 20, min_, 10, 43*time.Second)))
	// Over the limit: nothing is consumed (upstream would count them).
	h.expect(request("another", 11, key()), resp(over, st(over, 20, min_, 10, 43*time.Second)))
	h.expect(request("another", 10, key()), resp(ok, st(ok, 20, min_, 0, 43*time.Second)))
	// Exhausted: a check-only descriptor now reports OVER_LIMIT.
	h.expect(request("another", 0, withHits(key(), 0)), resp(over, st(over, 20, min_, 0, 43*time.Second)))
	// More than the limit can ever admit, on a fresh key: OVER_LIMIT, the
	// window's reset still reported, nothing consumed.
	h.expect(request("another", 0, withHits(desc("key2", "big"), 1<<60)), resp(over, st(over, 20, min_, 20, 43*time.Second)))
	h.expect(request("another", 21, desc("key2", "big")), resp(over, st(over, 20, min_, 20, 43*time.Second)))
	h.expect(request("another", 20, desc("key2", "big")), resp(ok, st(ok, 20, min_, 0, 43*time.Second)))
}

func TestBadRequests(t *testing.T) {
	h := start(t, integrationConfig(t))
	override := desc("key2", "x")
	override.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}
	negative := desc("key2", "x")
	negative.IsNegativeHits = true
	for _, c := range []struct {
		name string
		req  *rlspb.RateLimitRequest
		msg  string
	}{
		{"empty domain", request("", 0, desc("key2", "x")), "envoyrls: bad request: domain must not be empty"},
		{"no descriptors", request("another", 0), "envoyrls: bad request: descriptors must not be empty"},
		{"override without unit", request("another", 0, desc("key2", "y"), override), "envoyrls: bad request: descriptors[1].limit.unit must be a known unit, got UNKNOWN"},
		{"negative hits", request("another", 0, negative), "envoyrls: bad request: descriptors[0].is_negative_hits applies only to a descriptor with debit: true"},
	} {
		_, err := h.client.ShouldRateLimit(context.Background(), c.req)
		if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != c.msg {
			t.Errorf("%s: err = %v, want InvalidArgument %q", c.name, err, c.msg)
		}
	}
	// Nothing was counted by the failed calls.
	h.expect(request("another", 0, desc("key2", "y")), resp(ok, st(ok, 20, min_, 19, 43*time.Second)))
	// A bad request never reaches the store, even when the domain is unknown.
	if _, err := h.client.ShouldRateLimit(context.Background(), request("", 0)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty request: %v", err)
	}
}

func TestLimitOverride(t *testing.T) {
	h := start(t, integrationConfig(t))
	d := func(vals ...string) *rlcommon.RateLimitDescriptor {
		x := desc(vals...)
		x.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
		return x
	}
	// The override applies even where the tree has no rule, and wins where it has one.
	h.expect(request("another", 0, d("nothing", "here")), resp(ok, st(ok, 2, hour, 1, 3583*time.Second)))
	h.expect(request("another", 0, d("key2", "o")), resp(ok, st(ok, 2, hour, 1, 3583*time.Second)))
	h.expect(request("another", 0, d("key2", "o")), resp(ok, st(ok, 2, hour, 0, 3583*time.Second)))
	h.expect(request("another", 0, d("key2", "o")), resp(over, st(over, 2, hour, 0, 3583*time.Second)))
	// With a multiplier: a 30-minute window.
	x := desc("key2", "m")
	x.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(30)}
	want := st(ok, 2, min_, 1, 30*time.Minute-(17*time.Second))
	want.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(30)
	h.expect(request("another", 0, x), resp(ok, want))
}

func TestExtensions(t *testing.T) {
	h := start(t, mustParse(t, `
domain: ext
descriptors:
  - key: thirty
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 3}
  - key: str
    rate_limit: {name: str, limit: 5/30s}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_log}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra, burst: 3}
`))
	thirty := st(ok, 3, sec, 2, 13*time.Second) // the 30 s window began at +0 s: 12.75 s left
	thirty.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(30)
	h.expect(request("ext", 0, desc("thirty", "a")), resp(ok, thirty))

	strLimit := named(st(ok, 5, sec, 4, 13*time.Second), "str")
	strLimit.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(30)
	h.expect(request("ext", 0, desc("str", "a")), resp(ok, strLimit))

	// sliding_log: the state empties a full period after the last event.
	h.expect(request("ext", 0, desc("log", "a")), resp(ok, st(ok, 2, min_, 1, time.Minute)))
	h.clk.Add(45 * time.Second) // a fixed window would have reset by now
	h.expect(request("ext", 0, desc("log", "a")), resp(ok, st(ok, 2, min_, 0, time.Minute)))
	h.clk.Add(14 * time.Second)
	h.expect(request("ext", 0, withHits(desc("log", "a"), 0)), resp(over, st(over, 2, min_, 0, 46*time.Second)))
	h.clk.Add(time.Second) // the first event leaves the log
	h.expect(request("ext", 0, withHits(desc("log", "a"), 0)), resp(ok, st(ok, 2, min_, 1, 45*time.Second)))

	// gcra with a burst of 3 at one per second.
	for i := range 3 {
		h.expect(request("ext", 0, desc("bucket", "a")), resp(ok, st(ok, 1, sec, uint32(2-i), time.Duration(i+1)*time.Second)))
	}
	h.expect(request("ext", 0, desc("bucket", "a")), resp(over, st(over, 1, sec, 0, 3*time.Second)))
}

func TestQuotaMode(t *testing.T) {
	h := start(t, mustParse(t, `
domain: quota
descriptors:
  - key: backend_name
    descriptors:
      - key: model_name_override
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1}
`))
	a := func() *rlcommon.RateLimitDescriptor { return desc("backend_name", "a", "model_name_override", "m") }
	b := func() *rlcommon.RateLimitDescriptor { return desc("backend_name", "b", "model_name_override", "m") }
	h.expect(request("quota", 0, a()), resp(ok, st(ok, 1, min_, 0, 43*time.Second)))
	// One group over, another within its quota: the call is OK.
	h.expect(request("quota", 0, a(), b()), resp(ok, st(over, 1, min_, 0, 43*time.Second), st(ok, 1, min_, 0, 43*time.Second)))
	// Every group over: OVER_LIMIT.
	h.expect(request("quota", 0, a(), b()), resp(over, st(over, 1, min_, 0, 43*time.Second), st(over, 1, min_, 0, 43*time.Second)))
	// A plain descriptor over the limit makes the call over whatever the quotas say.
	h.expect(request("quota", 0, desc("plain", "p")), resp(ok, st(ok, 1, min_, 0, 43*time.Second)))
	h.expect(request("quota", 0, desc("plain", "p"), desc("backend_name", "c", "model_name_override", "m")),
		resp(over, st(over, 1, min_, 0, 43*time.Second), st(ok, 1, min_, 0, 43*time.Second)))
}

func TestConcurrentCallsCountExactly(t *testing.T) {
	h := start(t, integrationConfig(t))
	const workers, calls = 32, 25            // 800 calls against 20 per minute and 10 per hour
	var okKey2, okKey3, overall atomic.Int64 // overall: both OK in one call
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				r, err := h.client.ShouldRateLimit(context.Background(), request("another", 0, desc("key2", "c"), desc("key3", "c")))
				if err != nil {
					errs <- err
					return
				}
				if r.Statuses[0].Code == ok {
					okKey2.Add(1)
				}
				if r.Statuses[1].Code == ok {
					okKey3.Add(1)
				}
				if r.OverallCode == ok {
					overall.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Each descriptor is exact; a call may see key3 admit it after key2
	// refused it, so the calls admitted overall are at most 10.
	if okKey2.Load() != 20 || okKey3.Load() != 10 || overall.Load() > 10 || overall.Load() == 0 {
		t.Fatalf("allowed key2=%d key3=%d overall=%d, want 20, 10, 1..10", okKey2.Load(), okKey3.Load(), overall.Load())
	}
}

func TestSetConfigKeepsCounters(t *testing.T) {
	h := start(t, integrationConfig(t))
	for range 5 {
		h.call(request("another", 0, desc("key2", "r")))
	}
	h.svc.SetConfig(mustParse(t, `
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 8}
`))
	h.expect(request("another", 0, desc("key2", "r")), resp(ok, st(ok, 8, min_, 2, 43*time.Second)))
	h.expect(request("basic", 0, desc("key1", "r")), resp(ok, noLimit()))
	h.svc.SetConfig(nil)
	h.expect(request("another", 0, desc("key2", "r")), resp(ok, noLimit()))
	if len(h.svc.Config().Domains()) != 0 {
		t.Fatal("a nil config should know no domain")
	}
}

func TestDeciderAndObserver(t *testing.T) {
	storeDown := errors.New("redis: connection refused")
	var failing atomic.Bool
	var failed atomic.Int64
	cfg := integrationConfig(t)
	var h *harness
	h = start(t, cfg,
		WithDecider(func(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
			if failing.Load() {
				return storeDown
			}
			return StoreDecider(h.store)(ctx, reqs, res)
		}),
		WithObserver(func(_ context.Context, d Observation) {
			if d.Outcome == Failed {
				if !errors.Is(d.Err, storeDown) || d.Rule != "another.key2" {
					t.Errorf("failed decision %+v", d)
				}
				failed.Add(1)
			}
		}))
	h.expect(request("another", 0, desc("key2", "d")), resp(ok, st(ok, 20, min_, 19, 43*time.Second)))
	failing.Store(true)
	_, err := h.client.ShouldRateLimit(context.Background(), request("another", 0, desc("key2", "d"), desc("nothing", "x")))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want Unavailable", err)
	}
	if failed.Load() != 1 {
		t.Fatalf("failed decisions = %d, want 1", failed.Load())
	}
	// A descriptor without a rule never needs the store.
	h.expect(request("another", 0, desc("nothing", "x")), resp(ok, noLimit()))

	// A fail-open decider fills results and returns nil.
	open := New(cfg, h.store, WithClock(h.clk.Now), WithDecider(func(_ context.Context, reqs []weir.Request, res []weir.Result) error {
		for i, r := range reqs {
			res[i] = weir.Result{Allowed: true, Limit: r.Limit.Rate, Remaining: r.Limit.Rate}
		}
		return nil
	}))
	got, err := open.ShouldRateLimit(context.Background(), request("another", 0, desc("key2", "d")))
	if err != nil || !proto.Equal(got, resp(ok, st(ok, 20, min_, 20, 43*time.Second))) {
		t.Fatalf("fail-open: %v %v", prototext.Format(got), err)
	}
}

func TestDeciderPanicIsAnError(t *testing.T) {
	var logged strings.Builder
	h := start(t, integrationConfig(t), WithLogger(slog.New(slog.NewTextHandler(&logged, nil))), WithDecider(func(context.Context, []weir.Request, []weir.Result) error {
		panic("boom")
	}))
	_, err := h.client.ShouldRateLimit(context.Background(), request("another", 0, desc("key2", "p")))
	if status.Code(err) != codes.Internal || !strings.Contains(logged.String(), "panic=boom") {
		t.Fatalf("err = %v, want Internal; log %q", err, logged.String())
	}
}

func TestHealthService(t *testing.T) {
	h := start(t, integrationConfig(t))
	hc := healthpb.NewHealthClient(h.conn)
	for _, name := range []string{"", ServiceName} {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", name, r, err)
		}
	}
}

func TestStoreWithoutMulti(t *testing.T) {
	clk := newClock()
	store := takeOnly{memstore.New(memstore.WithClock(clk.Now))}
	svc := New(integrationConfig(t), store, WithClock(clk.Now))
	for i := range 3 {
		got, err := svc.ShouldRateLimit(context.Background(), request("another", 0, desc("key3", "s")))
		want := resp(ok, st(ok, 10, hour, uint32(9-i), 3583*time.Second))
		if err != nil || !proto.Equal(got, want) {
			t.Fatalf("call %d: %v %v", i, prototext.Format(got), err)
		}
	}
}

// takeOnly hides a store's MultiStore methods.
type takeOnly struct{ s weir.Store }

func (t takeOnly) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	return t.s.Take(ctx, key, l, n)
}
func (t takeOnly) Do(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
	return t.s.Do(ctx, reqs, res)
}

func TestStateKeys(t *testing.T) {
	e := func(kv ...string) []*rlcommon.RateLimitDescriptor_Entry { return desc(kv...).Entries }
	keys := map[string]string{
		stateKey("d", e("a", "b", "c", "d"), nil):                 "plain",
		stateKey("d", e("a", "b:c", "d", ""), nil):                "colon in value",
		stateKey("d", e("a:b", "c", "d", ""), nil):                "colon in key",
		stateKey("d", e("a", "=b"), nil):                          "tag-like value",
		stateKey("d", e("a", "b"), []string{"b"}):                 "shared",
		stateKey("d", e("a", "*b"), nil):                          "star value",
		stateKey("d:a", e("b", "c"), nil):                         "colon in domain",
		stateKey("d", e("a", "b", "c", ""), []string{"", ""}):     "tagged plain",
		stateKey("d", e("a", "b", "c", "x"), []string{"", "x*"}):  "shared second",
		stateKey("d", e("a", "b", "c", "x*"), []string{"", "x*"}): "shared literal",
		stateKey("d", e("a", "b", "c", "x*"), []string{"", ""}):   "plain literal",
		stateKey("d", e("a", "b", "c", "=x*"), []string{"", ""}):  "tagged literal",
		stateKey("d", e("a", "b", "c", "*x*"), []string{"", ""}):  "starred literal",
		stateKey("d", e("a", "b", "c", "x*"), []string{"x*", ""}): "shared first",
		stateKey("d", e("a", "", "c", ""), nil):                   "empty values",
	}
	if len(keys) != 14 {
		t.Fatalf("keys collide: %d distinct of 14: %v", len(keys), keys)
	}
	// Sharing is the point of share_threshold: all values under it meet.
	if stateKey("d", e("a", "b", "c", "x1"), []string{"", "x*"}) != stateKey("d", e("a", "b", "c", "x2"), []string{"", "x*"}) {
		t.Fatal("shared values have different keys")
	}
	if got := stateKey("rl", e("foo", "bar", "baz", "q"), nil); got != "envoy:rl:foo:bar:baz:q" {
		t.Fatalf("key = %q", got)
	}
}
