package main

import (
	"bytes"
	"context"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/server"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
)

// readmeDemoArgs returns the arguments of the weir bench command with which
// the README sends the demo traffic.
func readmeDemoArgs(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(readme), "\n") {
		if _, args, ok := strings.Cut(line, "./cmd/weir bench "); ok && strings.Contains(args, "--abusive") {
			return strings.Fields(args)
		}
	}
	t.Fatal("README.md has no weir bench command with --abusive")
	return nil
}

// TestReadmeDemoTrafficBoxesOnlyTheAbusers runs the README's demo traffic
// (weir bench's own key schedule, paced as --rate paces it) on a virtual
// clock against the demo's rule for 20 minutes, longer than the login
// rule's window: exactly the abusive identities land in the penalty box,
// and no ordinary one is ever rejected.
func TestReadmeDemoTrafficBoxesOnlyTheAbusers(t *testing.T) {
	var stderr bytes.Buffer
	c, code, ok := parseBenchArgs(readmeDemoArgs(t), &stderr, &stderr)
	if !ok {
		t.Fatalf("the README's command does not parse (%d): %s", code, stderr.String())
	}
	if c.target != "check" || c.rate <= 0 || c.dist != "uniform" {
		t.Fatalf("the README's demo is paced check traffic, uniform: %+v", c)
	}
	cfg, err := policy.Parse([]byte(server.DemoConfig), "demo")
	if err != nil {
		t.Fatal(err)
	}
	var lim weir.Limit
	found := false
	for _, r := range cfg.Rules {
		if r.Name == c.rule {
			if lim, err = weir.ParseLimit(r.Limit); err != nil {
				t.Fatal(err)
			}
			lim.Algorithm, lim.Block, found = weir.Algorithm(r.Algorithm), r.Block, true
		}
	}
	if !found || lim.Block == 0 {
		t.Fatalf("the demo has no rule %q with a penalty box", c.rule)
	}

	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	limiter := weir.NewLimiter(memstore.New(memstore.WithClock(func() time.Time { return now })))
	turn := new(atomic.Uint64)
	workers := make([]*benchWorker, c.concurrency)
	for w := range workers {
		workers[w] = newBenchWorker(&c, w, start, turn, nil, nil)
	}
	rejected := map[string]bool{}
	calls := 0
	for end := start.Add(20 * time.Minute); ; calls++ {
		// The next call is the worker whose paced slot comes first.
		wk := workers[0]
		for _, x := range workers[1:] {
			if x.next.Before(wk.next) {
				wk = x
			}
		}
		if now = wk.slot(); !now.Before(end) {
			break
		}
		key := wk.key()
		res, err := limiter.Allow(context.Background(), key, lim)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Allowed {
			rejected[key] = true
		}
	}
	var boxed []string
	for k := range rejected {
		boxed = append(boxed, k)
	}
	sort.Strings(boxed)
	var want []string
	for i := range c.abusiveKeys {
		want = append(want, "abuser-"+strconv.Itoa(i))
	}
	if strings.Join(boxed, ",") != strings.Join(want, ",") {
		t.Fatalf("after %d calls over 20 minutes, %d identities boxed: %v; want only the abusive ones %v", calls, len(boxed), boxed[:min(len(boxed), 10)], want)
	}
	if wantCalls := int(20 * 60 * c.rate); calls < wantCalls-1 || calls > wantCalls+1 {
		t.Fatalf("%d calls in 20 minutes at %v/s", calls, c.rate)
	}
}
