package replay

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

// Every rule here counts by the client address (grouped, or with other
// parts): the replay may decide on two goroutines.
const partitionConfig = `
allow: [192.0.2.200]
deny: [192.0.2.201]
rules:
  - name: login
    match: { methods: [POST], path: /login }
    limit: 3/1m
    algorithm: sliding_log
    block: 2m
  - name: site
    limit: 20/m
    burst: 5
  - name: search
    match: { methods: [GET], path: /search }
    identity: [ip/24]
    limit: 5/30s
    algorithm: sliding_window
    shadow: true
  - name: agent
    identity: [ip, "header:User-Agent"]
    limit: 10/m
    algorithm: fixed_window
  - name: plan
    match: { path: /api/ }
    tiers:
      by: query:plan
      default: { limit: 10/m }
      gold: { limit: 40/m, algorithm: token_bucket }
`

// Deciding on two goroutines, partitioned by client address group, gives
// the very report one goroutine gives.
func TestPartitionedSameAsSequential(t *testing.T) {
	reqs := traffic(6000, 3, func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(3)) * 300 * time.Millisecond })
	var log bytes.Buffer
	now := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	for _, r := range reqs {
		now = now.Add(r.step)
		fmt.Fprintf(&log, "%s - - [%s] \"%s %s HTTP/1.1\" 200 512 \"-\" \"%s\"\n", r.ip, now.Format("02/Jan/2006:15:04:05 -0700"), r.method, r.target, r.ua)
	}
	cfg, err := policy.Parse([]byte(partitionConfig), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var reps [2]*Report
	for i, parts := range []int{1, 2} {
		e, err := runEngine(context.Background(), []Input{{Name: "p.log", R: bytes.NewReader(log.Bytes())}}, []*config.Config{cfg}, Options{parts: parts})
		if err != nil {
			t.Fatal(err)
		}
		if len(e.workers) != parts {
			t.Fatalf("parts %d: %d workers", parts, len(e.workers))
		}
		reps[i] = e.tallies[0].report(&e.st)
	}
	a, b := *reps[0], *reps[1]
	a.limited, b.limited, a.shadow, b.shadow = nil, nil, nil, nil
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("one goroutine:\n%+v\ntwo:\n%+v", a, b)
	}
	limited := int64(0)
	for _, r := range a.Rules {
		limited += r.Limited + r.ShadowLimited
	}
	if limited < 100 || a.DenyListed == 0 || a.AllowListed == 0 {
		t.Fatalf("the workload does not exercise the rules: %+v", a.Rules)
	}
}

// A rule that counts by something else than the address keeps the replay
// on one goroutine.
func TestPartitionNeedsTheAddress(t *testing.T) {
	for spec, want := range map[string]bool{
		`identity: [ip]`: true, `identity: [ip/16]`: true, `identity: ["header:X-Key", ip]`: true,
		`identity: ["header:X-Key"]`: false, `identity: [method]`: false,
		"identity: [\"header:X-Key\"]\n    on_missing: use_ip": false,
	} {
		cfg, err := policy.Parse([]byte("rules:\n  - name: r\n    limit: 1/m\n    "+spec+"\n"), "t.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if got := newPartitioner([]*config.Config{cfg}, 2) != nil; got != want {
			t.Errorf("%s: partitioned %v, want %v", spec, got, want)
		}
	}
	p := newPartitioner([]*config.Config{mustParse(t, "rules:\n  - name: a\n    limit: 1/m\n    identity: [ip/24/48]\n  - name: b\n    limit: 1/m\n    identity: [ip/16]\n")}, 2)
	if p.bits4 != 16 || p.bits6 != 48 {
		t.Fatalf("grouping /%d /%d, want the coarsest: /16 and /48", p.bits4, p.bits6)
	}
	// Two addresses of one /16 always land together.
	if p.of(&Record{Addr: "10.1.2.3"}) != p.of(&Record{Addr: "10.1.200.7:443"}) {
		t.Fatal("one /16 in two partitions")
	}
}

func mustParse(t *testing.T, s string) *config.Config {
	t.Helper()
	c, err := policy.Parse([]byte(s), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}
