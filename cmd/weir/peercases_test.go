package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/envoyxds/xdstest"
	"github.com/weir-dev/weir/internal/redistest"
)

// The cases of envoyproxy/ratelimit's own tests that need a running
// service: its integration test over xDS-delivered config, its xDS
// provider cases (including MERGE_DOMAIN_CONFIG), its domain-merge
// config cases, and its end-to-end scripts (the descriptors Envoy sends
// for each scripted HTTP request, from the peer's example Envoy routes).
// Each case runs against weir serve in the peer's environment, over
// memstore and over Redis, and every field of every answer is checked:
// codes, limits, remaining, duration_until_reset (the peer's end-of-window
// formula at the time of the call), the dynamic metadata the peer builds
// under RESPONSE_DYNAMIC_METADATA, and nothing else set.
//
// With PEER_RATELIMIT naming a built envoyproxy/ratelimit binary, every
// call also goes to the peer (on its own redis-server) and the answers
// must be equal field for field. With PEER_SRC naming a clone of
// envoyproxy/ratelimit, its own configuration files are loaded unchanged
// instead of this package's copies in testdata/peercases.

// pd is one descriptor: key, value pairs, and its own hits_addend when
// hits >= 0.
type pd struct {
	kv   []string
	hits int64
}

func d(kv ...string) pd { return pd{kv: kv, hits: -1} }

func (p pd) addend(n int64) pd { p.hits = n; return p }

// pstep is one call, or a change of what the xDS server serves.
type pstep struct {
	snapshot []*rlsconfv3.RateLimitConfig // set before the call; refused when nack
	nack     string                       // the snapshot's NACK holds this
	next     bool                         // wait for the next minute first (the scripts' sleep 60)
	domain   string
	hits     uint32
	descs    []pd
	want     string         // overall code | status | status ...
	meta     map[string]any // the "metadata" of the dynamic metadata; nil for none
	add      [2]string      // copy this file (testdata, then PEER_SRC path) into the config directory first
	remove   string         // remove this file from the config directory first
	poll     bool           // repeat the call until the answer is want (a reload under way)
}

// pcase is a service started once and the calls made to it in order.
type pcase struct {
	name      string
	files     []string                     // testdata/peercases files for RUNTIME_ROOT/ratelimit/config
	peerFiles []string                     // the same, in a clone of the peer (PEER_SRC)
	snapshot  []*rlsconfv3.RateLimitConfig // CONFIG_TYPE=GRPC_XDS_SOTW with this first snapshot
	env       map[string]string
	steps     []pstep
	slow      bool // waits for a new minute
	// The Redis targets run on a Redis Cluster (REDIS_TYPE=CLUSTER) that
	// requires this password, over TLS when clusterTLS.
	cluster    string
	clusterTLS bool
	// metric, when set, is a counter weir must show at the end, as
	// {metric name, label selector substrings..., value}: weir's
	// counterpart of a statsd counter a script reads from the peer.
	metric []string
}

// peerTarget is one service under test.
type peerTarget struct {
	name   string
	xds    *xdstest.Server
	client rlspb.RateLimitServiceClient
	meta   bool   // RESPONSE_DYNAMIC_METADATA
	dir    string // the config directory (CONFIG_TYPE=FILE)
	http   string // weir's HTTP address (/metrics); "" for the peer
}

func minute(n uint32) *rlsconfv3.RateLimitPolicy {
	return &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: n}
}

func per(unit rlsconfv3.RateLimitUnit, n uint32) *rlsconfv3.RateLimitPolicy {
	return &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}
}

var unlimitedPolicy = &rlsconfv3.RateLimitPolicy{Unlimited: true}

func xdsDomain(name, domain string, descs ...*rlsconfv3.RateLimitDescriptor) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: descs}
}

func xdsDesc(key, value string, p *rlsconfv3.RateLimitPolicy, nested ...*rlsconfv3.RateLimitDescriptor) *rlsconfv3.RateLimitDescriptor {
	return &rlsconfv3.RateLimitDescriptor{Key: key, Value: value, RateLimit: p, Descriptors: nested}
}

// The first snapshot of the peer's xDS integration test: domains basic
// and another, each rule also under a _local name (the peer's local-cache
// variants).
func xdsBasic() []*rlsconfv3.RateLimitConfig {
	s, m, h, dy := rlsconfv3.RateLimitUnit_SECOND, rlsconfv3.RateLimitUnit_MINUTE, rlsconfv3.RateLimitUnit_HOUR, rlsconfv3.RateLimitUnit_DAY
	return []*rlsconfv3.RateLimitConfig{
		xdsDomain("basic", "basic", xdsDesc("key1", "", per(s, 50)), xdsDesc("key1_local", "", per(s, 50)), xdsDesc("one_per_minute", "", per(m, 1))),
		xdsDomain("another", "another",
			xdsDesc("key2", "", per(m, 20)), xdsDesc("key3", "", per(h, 10)),
			xdsDesc("key2_local", "", per(m, 20)), xdsDesc("key3_local", "", per(h, 10)),
			xdsDesc("key4", "", per(dy, 20)), xdsDesc("key4_local", "", per(dy, 20))),
	}
}

// basicSteps are the calls of the peer's basic integration case, on keys
// with suffix ("" or "_local").
func basicSteps(suffix string) []pstep {
	k := func(s string) string { return s + suffix }
	steps := []pstep{
		{domain: "foo", descs: []pd{d(k("hello"), "world")}, want: "OK|OK"},
		{domain: "basic", descs: []pd{d(k("key1"), "foo")}, want: "OK|OK 50/SECOND 49"},
	}
	for i := range 25 {
		w := fmt.Sprintf("OK|OK 20/MINUTE %d", 19-i)
		if i >= 20 {
			w = "OVER|OVER 20/MINUTE 0"
		}
		steps = append(steps, pstep{domain: "another", descs: []pd{d(k("key2"), "v-a")}, want: w})
	}
	for i := range 15 {
		w := fmt.Sprintf("OK|OK 20/MINUTE %d|OK 10/HOUR %d", 19-i, 9-i)
		if i >= 10 {
			w = fmt.Sprintf("OVER|OK 20/MINUTE %d|OVER 10/HOUR 0", 19-i)
		}
		steps = append(steps, pstep{domain: "another", descs: []pd{d(k("key2"), "v-b"), d(k("key3"), "v-b")}, want: w})
	}
	return append(steps,
		pstep{domain: "another", descs: []pd{d(k("key4"), "durTest")}, want: "OK|OK 20/DAY 19"},
		pstep{domain: "another", descs: []pd{d(k("key4"), "durTest")}, want: "OK|OK 20/DAY 18"})
}

func repeatStep(n int, s pstep, wants ...string) []pstep {
	out := make([]pstep, n)
	for i := range out {
		out[i] = s
		out[i].want = wants[min(i, len(wants)-1)]
	}
	return out
}

func concat(parts ...[]pstep) []pstep {
	var out []pstep
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// The descriptors Envoy sends for the peer's scripted requests, from the
// routes of its example Envoy configuration: a rate_limits entry yields a
// descriptor only when every header it reads is present.
var (
	twoHeader = func(foo, bar, baz string) []pd {
		var out []pd
		if bar != "" {
			out = append(out, d("foo", foo, "bar", bar))
		}
		if baz != "" {
			out = append(out, d("foo", foo, "baz", baz))
		}
		return out
	}
	fourHeader = func(foo, bar, src, dst string) []pd {
		return []pd{d("foo", foo, "bar", bar), d("source_cluster", src, "destination_cluster", dst)}
	}
	fiveHeader = func(foo, bar, src, dst, cat string) []pd {
		return append(fourHeader(foo, bar, src, dst), d("category", cat))
	}
	svc = func(name string) map[string]any {
		return map[string]any{"service_with_quota": map[string]any{"name": name}}
	}
)

func scriptCases() []pcase {
	file := []string{"rl.yaml"}
	peer := []string{"examples/ratelimit/config/config.yaml", "examples/ratelimit/config/example.yaml"}
	// As the peer's end-to-end environment.
	env := map[string]string{"RESPONSE_DYNAMIC_METADATA": "true", "RUNTIME_WATCH_ROOT": "false", "LOG_LEVEL": "debug"}
	rl := func(name string, slow bool, steps ...[]pstep) pcase {
		return pcase{name: "script/" + name, files: file, peerFiles: peer, env: env, steps: concat(steps...), slow: slow}
	}
	call := func(descs []pd, want string, meta map[string]any) pstep {
		return pstep{domain: "rl", descs: descs, want: want, meta: meta}
	}
	banned := twoHeader("bkthomps", "banned", "")
	return []pcase{
		rl("simple-get", false, []pstep{call(twoHeader("test", "", "shady"), "OK|OK 3/MINUTE 2", nil)}),
		rl("trigger-ratelimit", false, repeatStep(5, call(twoHeader("pelle", "", "not-so-shady"), "", nil),
			"OK|OK 3/MINUTE 2", "OK|OK 3/MINUTE 1", "OK|OK 3/MINUTE 0", "OVER|OVER 3/MINUTE 0")),
		rl("trigger-shadow-mode-key", false, repeatStep(6, call(twoHeader("pelle", "", "shady"), "", nil),
			"OK|OK 3/MINUTE 2", "OK|OK 3/MINUTE 1", "OK|OK 3/MINUTE 0")),
		func() pcase {
			// The peer's script then reads the statsd counter whose name
			// holds the value (detailed_metric); weir's counterpart is
			// labelled by the rule, never by the value.
			c := rl("value-included-in-stats-key-when-unspecified", false, repeatStep(3, call([]pd{d("unspec", "unspecified_value")}, "", nil),
				"OK|OK 2/MINUTE 1", "OK|OK 2/MINUTE 0", "OVER|OVER 2/MINUTE 0"))
			c.metric = []string{"weir_decisions_total", `rule="rl.unspec"`, `result="limited"`, "1"}
			return c
		}(),
		rl("replaces", false,
			[]pstep{call(banned, "OVER|OVER 0/MINUTE:banned_limit 0", nil),
				call(fourHeader("bkthomps", "banned", "proxy", "mock"), "OVER|OVER 0/MINUTE:banned_limit 0|OK 1/MINUTE 0", nil)},
			repeatStep(3, call(fourHeader("bkthomps", "banned", "proxy", "override"), "", nil),
				"OK|OK|OK 2/MINUTE 1", "OK|OK|OK 2/MINUTE 0", "OVER|OK|OVER 2/MINUTE 0"),
			repeatStep(3, call(fourHeader("my_foo", "bkthomps", "proxy", "bkthomps"), "", nil),
				"OK|OK|OK 2/MINUTE 1", "OK|OK|OK 2/MINUTE 0", "OVER|OK|OVER 2/MINUTE 0"),
			repeatStep(2, call(fourHeader("my_foo", "bkthomps", "proxy", "not_bkthomps"), "", nil),
				"OK|OK 1/MINUTE:bkthomps 0|OK", "OVER|OVER 1/MINUTE:bkthomps 0|OK"),
			[]pstep{call(fourHeader("my_foo", "bkthomps", "proxy", "bkthomps"), "OVER|OK|OVER 2/MINUTE 0", nil)},
			repeatStep(5, call(fiveHeader("my_foo", "bkthomps", "proxy", "fake", "account"), "", nil),
				"OK|OK|OK|OK 4/MINUTE 3", "OK|OK|OK|OK 4/MINUTE 2", "OK|OK|OK|OK 4/MINUTE 1", "OK|OK|OK|OK 4/MINUTE 0", "OVER|OK|OK|OVER 4/MINUTE 0"),
			repeatStep(2, call(twoHeader("foo_2", "bkthomps", ""), "", nil),
				"OK|OK 1/MINUTE:bkthomps 0", "OVER|OVER 1/MINUTE:bkthomps 0"),
			repeatStep(3, call(fourHeader("foo_3", "bar_3", "proxy", "fake"), "", nil),
				"OK|OK 3/MINUTE 2|OK 2/MINUTE:fake_name 1", "OK|OK 3/MINUTE 1|OK 2/MINUTE:fake_name 0", "OVER|OK 3/MINUTE 0|OVER 2/MINUTE:fake_name 0"),
			[]pstep{call(fiveHeader("my_foo", "bkthomps", "proxy", "fake", "account"), "OVER|OK|OK|OVER 4/MINUTE 0", nil)},
		),
		// /quota: both buckets charged; over only when both are spent.
		rl("quota", true, []pstep{
			call([]pd{d("service", "service_1"), d("service", "service_2")}, "OK|OK 1/MINUTE 0|OK 2/MINUTE 1", svc("service_1")),
			call([]pd{d("service", "service_1"), d("service", "service_2")}, "OK|OVER 1/MINUTE 0|OK 2/MINUTE 0", svc("service_2")),
			call([]pd{d("service", "service_1"), d("service", "service_2")}, "OVER|OVER 1/MINUTE 0|OVER 2/MINUTE 0", nil),
			{next: true, domain: "rl", descs: []pd{d("service", "service_1"), d("service", "service_2")}, want: "OK|OK 1/MINUTE 0|OK 2/MINUTE 1", meta: svc("service_1")},
		}),
		// /tokenquota: a check with hits_addend 0 on the request, a
		// charge of 1 when the stream is done.
		rl("token-quota", true, func() []pstep {
			check := func(want string) pstep {
				return call([]pd{d("service", "service_2").addend(0)}, want, svc("service_2"))
			}
			charge := func(want string, meta bool) pstep {
				s := call([]pd{d("service", "service_2").addend(1)}, want, nil)
				if meta {
					s.meta = svc("service_2")
				}
				return s
			}
			s := []pstep{
				check("OK|OK 2/MINUTE 2"), charge("OK|OK 2/MINUTE 1", true),
				check("OK|OK 2/MINUTE 1"), charge("OK|OK 2/MINUTE 0", true),
				check("OK|OK 2/MINUTE 0"), charge("OVER|OVER 2/MINUTE 0", false),
				{domain: "rl", descs: []pd{d("service", "service_2").addend(0)}, want: "OVER|OVER 2/MINUTE 0"},
			}
			refreshed := check("OK|OK 2/MINUTE 2")
			refreshed.next = true
			return append(s, refreshed)
		}()),
		// /multiservice-tokenquota: both buckets checked with 0, the one
		// named by the answer's metadata serves and is charged 1.
		rl("multiservice-tokenquota", true, func() []pstep {
			both := []pd{d("service", "service_1").addend(0), d("service", "service_2").addend(0)}
			check := func(want string, m map[string]any) pstep { return call(both, want, m) }
			charge := func(name, want string, m map[string]any) pstep {
				return call([]pd{d("service", name).addend(1)}, want, m)
			}
			s := []pstep{
				check("OK|OK 1/MINUTE 1|OK 2/MINUTE 2", svc("service_1")), charge("service_1", "OK|OK 1/MINUTE 0", svc("service_1")),
				check("OK|OK 1/MINUTE 0|OK 2/MINUTE 2", svc("service_1")), charge("service_1", "OVER|OVER 1/MINUTE 0", nil),
				check("OK|OVER 1/MINUTE 0|OK 2/MINUTE 2", svc("service_2")), charge("service_2", "OK|OK 2/MINUTE 1", svc("service_2")),
				check("OK|OVER 1/MINUTE 0|OK 2/MINUTE 1", svc("service_2")), charge("service_2", "OK|OK 2/MINUTE 0", svc("service_2")),
				check("OK|OVER 1/MINUTE 0|OK 2/MINUTE 0", svc("service_2")), charge("service_2", "OVER|OVER 2/MINUTE 0", nil),
				check("OVER|OVER 1/MINUTE 0|OVER 2/MINUTE 0", nil),
			}
			refreshed := check("OK|OK 1/MINUTE 1|OK 2/MINUTE 2", svc("service_1"))
			refreshed.next = true
			return append(s, refreshed)
		}()),
	}
}

// The config files of the peer's integration test (its reload.yaml is
// added and removed by the reload case).
var (
	integFiles     = []string{"basic.yaml", "another.yaml", "share-threshold.yaml"}
	integPeerFiles = []string{"test/integration/runtime/current/ratelimit/config/basic.yaml",
		"test/integration/runtime/current/ratelimit/config/another.yaml",
		"test/integration/runtime/current/ratelimit/config/share_threshold.yaml"}
)

func xdsCases() []pcase {
	m, h, dy := rlsconfv3.RateLimitUnit_MINUTE, rlsconfv3.RateLimitUnit_HOUR, rlsconfv3.RateLimitUnit_DAY
	reload := xdsDomain("reload", "reload", xdsDesc("key1", "", per(rlsconfv3.RateLimitUnit_SECOND, 50)),
		xdsDesc("block", "", per(rlsconfv3.RateLimitUnit_SECOND, 0)), xdsDesc("one_per_minute", "", per(m, 1)))
	k1 := func(n uint32) *rlsconfv3.RateLimitConfig {
		return xdsDomain("foo", "foo", xdsDesc("k1", "v1", minute(n)))
	}
	bar := xdsDomain("bar", "bar", xdsDesc("k1", "v1", minute(100)))
	deeper := xdsDomain("foo", "foo",
		xdsDesc("k1", "v1", minute(10), xdsDesc("k2", "", unlimitedPolicy), xdsDesc("k2", "v2", per(h, 15))),
		&rlsconfv3.RateLimitDescriptor{Key: "j1", Value: "v2", RateLimit: unlimitedPolicy, Descriptors: []*rlsconfv3.RateLimitDescriptor{
			xdsDesc("j2", "", unlimitedPolicy),
			{Key: "j2", Value: "v2", RateLimit: per(dy, 15), ShadowMode: true, QuotaMode: true},
		}})
	sameDomain := []*rlsconfv3.RateLimitConfig{
		xdsDomain("foo-1", "foo", xdsDesc("k1", "v1", minute(10))),
		xdsDomain("foo-2", "foo", xdsDesc("k1", "v2", minute(100))),
	}
	provider := func(merge bool) []pstep {
		s := []pstep{
			{domain: "foo", descs: []pd{d("k1", "v1")}, want: "OK|OK 3/MINUTE 2"},
			{snapshot: []*rlsconfv3.RateLimitConfig{xdsDomain("foo", "foo", xdsDesc("k2", "v2", minute(5)))},
				domain: "foo", descs: []pd{d("k2", "v2"), d("k1", "v1")}, want: "OK|OK 5/MINUTE 4|OK"},
			{snapshot: []*rlsconfv3.RateLimitConfig{k1(10), bar},
				domain: "foo", descs: []pd{d("k1", "v1"), d("k2", "v2")}, want: "OK|OK 10/MINUTE 8|OK"},
			{domain: "bar", descs: []pd{d("k1", "v1")}, want: "OK|OK 100/MINUTE 99"},
			{snapshot: []*rlsconfv3.RateLimitConfig{deeper, bar},
				domain: "foo", descs: []pd{d("k1", "v1"), d("k1", "v1", "k2", "any"), d("k1", "v1", "k2", "v2")},
				want: "OK|OK 10/MINUTE 7|OK unlimited|OK 15/HOUR 14"},
			{domain: "foo", descs: []pd{d("j1", "v2"), d("j1", "v2", "j2", "any"), d("j1", "v2", "j2", "v2")},
				want: "OK|OK unlimited|OK unlimited|OK 15/DAY 14"},
			{domain: "bar", descs: []pd{d("k1", "v1")}, want: "OK|OK 100/MINUTE 98"},
		}
		if merge {
			return append(s, pstep{snapshot: sameDomain, domain: "foo", descs: []pd{d("k1", "v1"), d("k1", "v2")}, want: "OK|OK 10/MINUTE 6|OK 100/MINUTE 99"})
		}
		// Without MERGE_DOMAIN_CONFIG the snapshot is refused and the
		// last good one stays.
		return append(s, pstep{snapshot: sameDomain, nack: "foo", domain: "foo", descs: []pd{d("k1", "v1"), d("k1", "v2")}, want: "OK|OK 10/MINUTE 6|OK"})
	}
	return []pcase{
		{name: "xds/basic", snapshot: xdsBasic(), steps: basicSteps("")},
		{name: "xds/basic-local-cache", snapshot: xdsBasic(), env: map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "1000"}, steps: basicSteps("_local")},
		{name: "xds/reload", snapshot: xdsBasic(), steps: []pstep{
			{domain: "reload", descs: []pd{d("block", "foo")}, want: "OK|OK"},
			{snapshot: append(xdsBasic(), reload), domain: "reload", descs: []pd{d("key1", "foo")}, want: "OK|OK 50/SECOND 49"},
			{domain: "reload", descs: []pd{d("block", "foo")}, want: "OVER|OVER 0/SECOND 0"},
			{snapshot: xdsBasic(), domain: "reload", descs: []pd{d("key1", "foo")}, want: "OK|OK"},
		}},
		{name: "xds/provider", snapshot: []*rlsconfv3.RateLimitConfig{k1(3)}, steps: provider(false)},
		{name: "xds/provider-merge", snapshot: []*rlsconfv3.RateLimitConfig{k1(3)}, env: map[string]string{"MERGE_DOMAIN_CONFIG": "true"}, steps: provider(true)},
		// The peer's integration test over files, on a Redis Cluster that
		// requires a password (and over TLS), and its reload.
		{name: "file/basic", files: integFiles, peerFiles: integPeerFiles, steps: basicSteps("")},
		{name: "file/basic-cluster-auth", files: integFiles, peerFiles: integPeerFiles, steps: basicSteps(""), cluster: "password123"},
		{name: "file/basic-cluster-tls-auth", files: integFiles, peerFiles: integPeerFiles, steps: basicSteps(""), cluster: "password123", clusterTLS: true},
		{name: "file/reload", files: integFiles, peerFiles: integPeerFiles, env: map[string]string{"RUNTIME_WATCH_ROOT": "false"}, steps: []pstep{
			{domain: "reload", descs: []pd{d("block", "foo")}, want: "OK|OK"},
			{add: [2]string{"reload.yaml", "test/integration/runtime/current/ratelimit/reload.yaml"}, poll: true,
				domain: "reload", descs: []pd{d("block", "foo")}, want: "OVER|OVER 0/SECOND 0"},
			{domain: "reload", descs: []pd{d("key1", "foo")}, want: "OK|OK 50/SECOND 49"},
			{remove: "reload.yaml", poll: true, domain: "reload", descs: []pd{d("block", "foo")}, want: "OK|OK"},
		}},
		{name: "file/share-threshold", files: integFiles, peerFiles: integPeerFiles, steps: func() []pstep {
			var s []pstep
			for i := range 10 {
				s = append(s, pstep{domain: "share-threshold-test", descs: []pd{d("files", "files/a.pdf")}, want: fmt.Sprintf("OK|OK 10/HOUR %d", 9-i)})
			}
			s = append(s, pstep{domain: "share-threshold-test", descs: []pd{d("files", "files/b.csv")}, want: "OVER|OVER 10/HOUR 0"})
			for i := range 10 {
				s = append(s, pstep{domain: "share-threshold-test", descs: []pd{d("files_no_share", fmt.Sprintf("files_no_share/%d", i))}, want: "OK|OK 10/HOUR 9"})
			}
			return s
		}()},
		{name: "file/merge-domain", files: []string{"merge-a.yaml", "merge-b.yaml"},
			peerFiles: []string{"test/config/merge_domain_key1.yaml", "test/config/merge_domain_key2.yaml"},
			env:       map[string]string{"MERGE_DOMAIN_CONFIG": "true"},
			steps: []pstep{
				{domain: "foo_domain", descs: []pd{d("key1", "value1")}, want: "OK|OK"},
				{domain: "test-domain", descs: []pd{d("key1", "value1"), d("key2", "value2"), d("key1", "value2")}, want: "OK|OK 10/MINUTE 9|OK 20/MINUTE 19|OK"},
			}},
	}
}

// TestPeerCases runs every case on weir serve over memstore and Redis (and
// on the peer when PEER_RATELIMIT is set).
func TestPeerCases(t *testing.T) {
	cases := append(xdsCases(), scriptCases()...)
	var mu sync.Mutex
	calls, agreed := 0, 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.slow && testing.Short() {
				t.Skip("waits for the next minute")
			}
			t.Parallel()
			n, a := runPeerCase(t, c)
			mu.Lock()
			calls += n
			agreed += a
			mu.Unlock()
		})
	}
	t.Cleanup(func() {
		t.Logf("%d cases, %d calls checked on every target; %d compared with the peer field for field", len(cases), calls, agreed)
	})
}

// peerEnvFor is the peer environment of case c, its files (if any) in a
// runtime directory of its own.
func peerEnvFor(t *testing.T, c pcase) map[string]string {
	env := map[string]string{"USE_STATSD": "false", "REDIS_SOCKET_TYPE": "tcp", "LOG_LEVEL": "info",
		"RUNTIME_SUBDIRECTORY": "ratelimit", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1"}
	// REDIS_TIMEOUT unset: the peer's 10s, on weir too.
	for k, v := range c.env {
		env[k] = v
	}
	root := t.TempDir()
	env["RUNTIME_ROOT"] = root
	if c.snapshot != nil {
		env["CONFIG_TYPE"] = "GRPC_XDS_SOTW"
		env["CONFIG_GRPC_XDS_NODE_ID"] = "peer-cases"
		env["XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"] = "50ms"
		env["XDS_CLIENT_BACKOFF_MAX_INTERVAL"] = "200ms"
		return env
	}
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("PEER_SRC") != "" {
		for _, f := range c.peerFiles {
			copyPeerFile(t, dir, "", f)
		}
	} else {
		for _, f := range c.files {
			copyPeerFile(t, dir, f, "")
		}
	}
	return env
}

// copyPeerFile copies testdata/peercases/own, or with PEER_SRC set the
// peer's own file peer, into dir under the name of the one copied.
func copyPeerFile(t *testing.T, dir, own, peer string) {
	t.Helper()
	from := filepath.Join("testdata", "peercases", own)
	if src := os.Getenv("PEER_SRC"); src != "" {
		from = filepath.Join(src, peer)
	}
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(from)), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// startTargets starts weir serve over memstore and over Redis, and the
// peer when PEER_RATELIMIT is set; the peer is the first target.
func startTargets(t *testing.T, c pcase) []*peerTarget {
	var targets []*peerTarget
	mk := func(name string) (*peerTarget, map[string]string) {
		env := peerEnvFor(t, c)
		tg := &peerTarget{name: name, meta: env["RESPONSE_DYNAMIC_METADATA"] == "true",
			dir: filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")}
		if c.snapshot != nil {
			tg.xds = xdstest.Start(t, "127.0.0.1:0", nil, "peer-cases")
			tg.xds.Set("1", c.snapshot...)
			env["CONFIG_GRPC_XDS_SERVER_URL"] = tg.xds.Addr
		}
		return tg, env
	}
	dial := func(tg *peerTarget, addr string) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		tg.client = rlspb.NewRateLimitServiceClient(conn)
	}
	if bin := os.Getenv("PEER_RATELIMIT"); bin != "" {
		tg, env := mk("peer")
		peerRedisEnv(t, c, env)
		httpAddr, grpcAddr, debugAddr := freeAddr(t), freeAddr(t), freeAddr(t)
		env["PORT"], env["GRPC_PORT"], env["DEBUG_PORT"] = portOf(httpAddr), portOf(grpcAddr), portOf(debugAddr)
		startPeerProcess(t, bin, env, httpAddr, tg.xds)
		dial(tg, grpcAddr)
		targets = append(targets, tg)
	}
	for _, store := range []string{"memstore", "redis"} {
		tg, env := mk("weir/" + store)
		// Port 0: the serving line names the ports the kernel chose, so no
		// other test can take one between choosing and binding it.
		env["GRPC_PORT"], env["PORT"] = "0", "0"
		var args []string
		if store == "redis" {
			peerRedisEnv(t, c, env)
			args = asPeer([]string{"/bin/ratelimit"}, io.Discard)[1:]
		} else {
			// The same environment, translated, without its Redis.
			env["REDIS_URL"] = "unused:6379"
			tr, _, err := translatePeerEnv(envLookup(env), hasServeFlag)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range tr {
				if !strings.HasPrefix(a, "--redis") && !strings.HasPrefix(a, "--store-timeout") {
					args = append(args, a)
				}
			}
			env = map[string]string{}
		}
		_, line, _ := startServe(t, env, args...)
		httpAddr, grpcAddr := line[1], strings.TrimPrefix(line[2], "gRPC ")
		tg.http = httpAddr
		if tg.xds != nil {
			tg.xds.WaitRequest("ACK of version 1", xdstest.ACK("1"))
		}
		dial(tg, grpcAddr)
		targets = append(targets, tg)
	}
	return targets
}

// peerRedisEnv starts the Redis of one target and sets env to reach it.
func peerRedisEnv(t *testing.T, c pcase, env map[string]string) {
	t.Helper()
	if c.cluster == "" {
		env["REDIS_URL"] = redistest.Standalone(t).Addr
		return
	}
	sec := redistest.ClusterSecurity{Password: c.cluster}
	if c.clusterTLS {
		pki := certtest.New(t)
		sec.TLS = &redistest.TLS{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, Client: pki.ClientConfig(false)}
		env["REDIS_TLS"], env["REDIS_TLS_CACERT"] = "true", pki.CA
	}
	g := redistest.ClusterSecure(t, sec)
	env["REDIS_TYPE"], env["REDIS_URL"], env["REDIS_AUTH"] = "CLUSTER", strings.Join(g.Addrs, ","), c.cluster
}

// startPeerProcess runs envoyproxy/ratelimit with env until the test
// ends, and waits until it is healthy (and has ACKed its first snapshot).
func startPeerProcess(t *testing.T, bin string, env map[string]string, httpAddr string, xds *xdstest.Server) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("peer output:\n%s", out.String())
		}
	})
	if xds != nil {
		xds.WaitRequest("the peer's ACK of version 1", xdstest.ACK("1"))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer is not healthy after 30s:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// roomInMinute waits, if need be, for a minute with at least 20 s left,
// so that a case's calls fall in one window of the real clock.
func roomInMinute() {
	now := time.Now()
	if left := time.Minute - now.Sub(now.Truncate(time.Minute)); left < 20*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
}

func nextMinute() {
	now := time.Now()
	time.Sleep(time.Minute - now.Sub(now.Truncate(time.Minute)) + 100*time.Millisecond)
}

func runPeerCase(t *testing.T, c pcase) (calls, agreed int) {
	targets := startTargets(t, c)
	withPeer := targets[0].name == "peer"
	version := 1
	roomInMinute()
	for i, s := range c.steps {
		if s.snapshot != nil {
			version++
			v := fmt.Sprint(version)
			for _, tg := range targets {
				tg.xds.Set(v, s.snapshot...)
			}
			for _, tg := range targets {
				if s.nack != "" {
					tg.xds.WaitRequest(tg.name+": NACK of version "+v, xdstest.NACK(s.nack))
				} else {
					tg.xds.WaitRequest(tg.name+": ACK of version "+v, xdstest.ACK(v))
				}
			}
		}
		if s.next {
			nextMinute()
		}
		for _, tg := range targets {
			if s.add[0] != "" {
				copyPeerFile(t, tg.dir, s.add[0], s.add[1])
			}
			if s.remove != "" {
				if err := os.Remove(filepath.Join(tg.dir, s.remove)); err != nil {
					t.Fatal(err)
				}
			}
		}
		req := &rlspb.RateLimitRequest{Domain: s.domain, HitsAddend: s.hits}
		for _, p := range s.descs {
			rd := &rlcommon.RateLimitDescriptor{}
			for j := 0; j+1 < len(p.kv); j += 2 {
				rd.Entries = append(rd.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: p.kv[j], Value: p.kv[j+1]})
			}
			if p.hits >= 0 {
				rd.HitsAddend = wrapperspb.UInt64(uint64(p.hits))
			}
			req.Descriptors = append(req.Descriptors, rd)
		}
		var first *rlspb.RateLimitResponse
		for _, tg := range targets {
			var resp *rlspb.RateLimitResponse
			var before, after time.Time
			for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
				var err error
				before = time.Now()
				resp, err = tg.client.ShouldRateLimit(context.Background(), req)
				after = time.Now()
				if err != nil {
					t.Fatalf("%s: step %d: %v", tg.name, i, err)
				}
				if !s.poll || renderPeerAnswer(resp) == s.want || time.Since(start) > 60*time.Second {
					break
				}
			}
			norm := checkPeerAnswer(t, fmt.Sprintf("%s: step %d (%s)", tg.name, i, prototext.Format(req)), tg, s, req, resp, before, after)
			if first == nil {
				first = norm
			} else if withPeer && !proto.Equal(first, norm) {
				t.Errorf("%s: step %d: differs from the peer\npeer %v\nweir %v", tg.name, i, prototext.Format(first), prototext.Format(norm))
			}
		}
		calls++
		if withPeer && !t.Failed() {
			agreed++
		}
	}
	if c.metric != nil {
		for _, tg := range targets {
			if tg.http != "" {
				checkPeerMetric(t, tg, c.metric)
			}
		}
	}
	return calls, agreed
}

// checkPeerMetric finds the series of m (name, label substrings...,
// value) in tg's /metrics.
func checkPeerMetric(t *testing.T, tg *peerTarget, m []string) {
	t.Helper()
	resp, err := http.Get("http://" + tg.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	name, labels, want := m[0], m[1:len(m)-1], m[len(m)-1]
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(line, l)
		}
		if all {
			if f := strings.Fields(line); f[len(f)-1] != want {
				t.Errorf("%s: %s, want the value %s", tg.name, line, want)
			}
			return
		}
	}
	t.Errorf("%s: no %s series with %q in /metrics", tg.name, name, labels)
}

// checkPeerAnswer checks every field of resp against step s and returns
// it with its durations (checked) cleared, for comparison between
// targets.
func checkPeerAnswer(t *testing.T, what string, tg *peerTarget, s pstep, req *rlspb.RateLimitRequest, resp *rlspb.RateLimitResponse, before, after time.Time) *rlspb.RateLimitResponse {
	t.Helper()
	if got := renderPeerAnswer(resp); got != s.want {
		t.Errorf("%s:\ngot  %s\nwant %s", what, got, s.want)
	}
	norm := proto.Clone(resp).(*rlspb.RateLimitResponse)
	for _, st := range norm.Statuses {
		if st.CurrentLimit == nil {
			if st.DurationUntilReset != nil {
				t.Errorf("%s: duration_until_reset %v without a limit", what, st.DurationUntilReset)
			}
			continue
		}
		secs := unitSeconds(st.CurrentLimit.Unit)
		got := st.GetDurationUntilReset()
		w1, w2 := secs-before.Unix()%secs, secs-after.Unix()%secs
		if got.GetNanos() != 0 || (got.GetSeconds() != w1 && got.GetSeconds() != w2) {
			t.Errorf("%s: duration_until_reset %v, want %ds (the end of the %v window)", what, got.AsDuration(), w1, st.CurrentLimit.Unit)
		}
		st.DurationUntilReset = nil
	}
	var wantMeta *structpb.Struct
	if tg.meta {
		wantMeta = peerMetadata(t, req, s.meta)
	}
	if !proto.Equal(resp.DynamicMetadata, wantMeta) {
		t.Errorf("%s: dynamic metadata\ngot  %v\nwant %v", what, prototext.Format(resp.DynamicMetadata), prototext.Format(wantMeta))
	}
	// Nothing else may be set.
	rest := proto.Clone(norm).(*rlspb.RateLimitResponse)
	rest.OverallCode, rest.DynamicMetadata = 0, nil
	for _, st := range rest.Statuses {
		st.Code, st.CurrentLimit, st.LimitRemaining = 0, nil, 0
		if proto.Size(st) != 0 {
			t.Errorf("%s: a status has more fields: %v", what, prototext.Format(st))
		}
	}
	rest.Statuses = nil
	if proto.Size(rest) != 0 {
		t.Errorf("%s: the answer has more fields: %v", what, prototext.Format(rest))
	}
	return norm
}

// renderPeerAnswer writes codes, limits and remaining as the tables do.
func renderPeerAnswer(r *rlspb.RateLimitResponse) string {
	code := func(c rlspb.RateLimitResponse_Code) string {
		switch c {
		case rlspb.RateLimitResponse_OK:
			return "OK"
		case rlspb.RateLimitResponse_OVER_LIMIT:
			return "OVER"
		}
		return c.String()
	}
	parts := []string{code(r.OverallCode)}
	for _, s := range r.Statuses {
		p := code(s.Code)
		switch l := s.CurrentLimit; {
		case l != nil:
			p += fmt.Sprintf(" %d/%s", l.RequestsPerUnit, l.Unit)
			if l.Name != "" {
				p += ":" + l.Name
			}
			p += fmt.Sprintf(" %d", s.LimitRemaining)
		case s.LimitRemaining == math.MaxUint32:
			p += " unlimited"
		case s.LimitRemaining != 0:
			p += fmt.Sprintf(" remaining %d without a limit", s.LimitRemaining)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "|")
}

func unitSeconds(u rlspb.RateLimitResponse_RateLimit_Unit) int64 {
	switch u {
	case rlspb.RateLimitResponse_RateLimit_SECOND:
		return 1
	case rlspb.RateLimitResponse_RateLimit_MINUTE:
		return 60
	case rlspb.RateLimitResponse_RateLimit_HOUR:
		return 3600
	case rlspb.RateLimitResponse_RateLimit_DAY:
		return 86400
	}
	return 1
}

// peerMetadata is the dynamic metadata the peer answers with under
// RESPONSE_DYNAMIC_METADATA: the domain, each descriptor's entries as
// "key=value" (and its hits_addend when set), the request's hits_addend
// when not 0, and meta, the merged metadata of the descriptors that
// passed.
func peerMetadata(t *testing.T, req *rlspb.RateLimitRequest, meta map[string]any) *structpb.Struct {
	t.Helper()
	var descs []any
	for _, rd := range req.Descriptors {
		var entries []any
		for _, e := range rd.Entries {
			entries = append(entries, e.Key+"="+e.Value)
		}
		m := map[string]any{"entries": entries}
		if rd.HitsAddend != nil {
			m["hitsAddend"] = float64(rd.HitsAddend.Value)
		}
		descs = append(descs, m)
	}
	m := map[string]any{"domain": req.Domain, "descriptors": descs}
	if req.HitsAddend != 0 {
		m["hitsAddend"] = float64(req.HitsAddend)
	}
	if meta != nil {
		m["metadata"] = meta
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPeerCasesRefusedConfig: the peer's domain-merge cases whose files
// must not load (a domain in two files without MERGE_DOMAIN_CONFIG; the
// same descriptor in two files with it). weir serve refuses to start,
// naming the problem; the peer logs it, reports healthy with no
// configuration, and fails every call (docs/envoy.md, Differences).
func TestPeerCasesRefusedConfig(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string // name in the directory → testdata file
		peer  map[string]string // the same, from PEER_SRC
		merge bool
		want  string
	}{
		{"two files, one domain", map[string]string{"a.yaml": "merge-a.yaml", "b.yaml": "merge-b.yaml"},
			map[string]string{"a.yaml": "test/config/merge_domain_key1.yaml", "b.yaml": "test/config/merge_domain_key2.yaml"}, false, `domain "test-domain" is already defined`},
		{"one descriptor twice, merged", map[string]string{"a.yaml": "merge-a.yaml", "b.yaml": "merge-a.yaml"},
			map[string]string{"a.yaml": "test/config/merge_domain_key1.yaml", "b.yaml": "test/config/merge_domain_key1.yaml"}, true, "key1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			files := c.files
			if os.Getenv("PEER_SRC") != "" {
				files = c.peer
			}
			root := t.TempDir()
			dir := filepath.Join(root, "ratelimit", "config")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for to, from := range files {
				if src := os.Getenv("PEER_SRC"); src != "" {
					from = filepath.Join(src, from)
				} else {
					from = filepath.Join("testdata", "peercases", from)
				}
				b, err := os.ReadFile(from)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, to), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			rds := redistest.Standalone(t)
			env := map[string]string{"USE_STATSD": "false", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rds.Addr,
				"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "MERGE_DOMAIN_CONFIG": fmt.Sprint(c.merge),
				"HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1",
				"PORT": portOf(freeAddr(t)), "GRPC_PORT": portOf(freeAddr(t)), "DEBUG_PORT": portOf(freeAddr(t))}
			var stdout, stderr syncBuffer
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			code := serve(ctx, asPeer([]string{"/bin/ratelimit"}, io.Discard)[1:], &stdout, &stderr, envLookup(env), nil)
			if code == 0 || !strings.Contains(stderr.String(), c.want) || !strings.Contains(stderr.String(), "b.yaml") {
				t.Fatalf("weir serve: exit %d, want a refusal naming b.yaml and %q:\n%s%s", code, c.want, stdout.String(), stderr.String())
			}
			bin := os.Getenv("PEER_RATELIMIT")
			if bin == "" {
				return
			}
			httpAddr := "127.0.0.1:" + env["PORT"]
			startPeerProcess(t, bin, env, httpAddr, nil)
			conn, err := grpc.NewClient("127.0.0.1:"+env["GRPC_PORT"], grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "test-domain",
				Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "key1", Value: "value1"}}}}})
			if err == nil || !strings.Contains(err.Error(), "no rate limit configuration loaded") {
				t.Fatalf("the peer with a refused configuration: err = %v", err)
			}
		})
	}
}
