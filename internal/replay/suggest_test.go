package replay

import (
	"context"
	"fmt"
	"hash/maphash"
	"strings"
	"testing"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/memstore"
)

// stairLog: client i (1..50) sends i requests within one minute.
func stairLog() string {
	var b strings.Builder
	for s := 0; s < 50; s++ {
		for i := 1; i <= 50; i++ {
			if s < i {
				fmt.Fprintf(&b, "%s\n", nginxLine(fmt.Sprintf("198.51.100.%d", i), s, "/"))
			}
		}
	}
	return b.String()
}

func windowConfig(limit string) string {
	return fmt.Sprintf("rules:\n  - name: ip\n    limit: %s\n    algorithm: fixed_window\n", limit)
}

// --suggest finds the smallest limit under which at most the target share
// of identities is limited: with client i sending i requests in a minute,
// N/m limits the 50-N clients above N, so 10% of 50 needs 45/m.
func TestSuggest(t *testing.T) {
	log := stairLog()
	open := func() ([]Input, func(), error) {
		return []Input{{Name: "stair.log", R: strings.NewReader(log)}}, func() {}, nil
	}
	cfg, err := policy.Parse([]byte(windowConfig("7/m")), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		target float64
		want   int64
	}{{0.10, 45}, {0, 50}, {0.5, 25}, {0.98, 1}} {
		s, err := Suggest(context.Background(), open, cfg, "ip", c.target, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Rate != c.want || s.Limit != fmt.Sprintf("%d/m", c.want) || s.Identities != 50 || s.LimitedIdentities != 50-c.want {
			t.Fatalf("target %v: %+v, want %d/m", c.target, s, c.want)
		}
	}
	if _, err := Suggest(context.Background(), open, cfg, "nope", 0.01, Options{}); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("unknown rule: %v", err)
	}
	keyCfg, _ := policy.Parse([]byte("rules:\n  - name: k\n    identity: [\"header:X-API-Key\"]\n    limit: 1/m\n"), "t.yaml")
	if _, err := Suggest(context.Background(), open, keyCfg, "k", 0.01, Options{}); err == nil || !strings.Contains(err.Error(), "X-API-Key") {
		t.Fatalf("a rule the log cannot evaluate: %v", err)
	}
}

// --compare shows per rule what changes and for whom.
func TestCompare(t *testing.T) {
	base, _ := policy.Parse([]byte(windowConfig("10/m")), "a.yaml")
	other, _ := policy.Parse([]byte(windowConfig("30/m")), "b.yaml")
	reps, err := Run(context.Background(), []Input{{Name: "stair.log", R: strings.NewReader(stairLog())}}, []*config.Config{base, other}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := Compare(reps[0], reps[1])
	if len(c.Changes) != 1 {
		t.Fatalf("%+v", c.Changes)
	}
	ch := c.Changes[0]
	// base limits clients 11..50 (sum of i-10), other 31..50 (sum of i-30).
	if ch.LimitedIdentities != [2]int64{40, 20} || ch.Limited != [2]int64{820, 210} {
		t.Fatalf("change %+v", ch)
	}
	if len(ch.NewlyLimited) != 0 || len(ch.NoLongerLimited) != 10 || ch.NoLongerLimited[0] != (Top{"198.51.100.30", 20}) {
		t.Fatalf("for whom: %+v", ch)
	}
	var b strings.Builder
	WriteCompareText(&b, c, "a.yaml", "b.yaml")
	if !strings.Contains(b.String(), "-610") || !strings.Contains(b.String(), "198.51.100.30") {
		t.Fatalf("text:\n%s", b.String())
	}
}

// The identity tally is exact up to its bound and an estimate beyond,
// within 3%, in bounded memory.
func TestIDSetBound(t *testing.T) {
	for _, counts := range []bool{false, true} {
		s := newIDSet(1000, maphash.MakeSeed(), counts)
		for i := 0; i < 200_000; i++ {
			s.add(fmt.Sprintf("id-%d", i), 1)
			s.add(fmt.Sprintf("id-%d", i/2), 1)
		}
		if s.size() != 1000 || !s.over {
			t.Fatalf("counts %v: held %d identities", counts, s.size())
		}
		if n := s.count(); n < 194_000 || n > 206_000 {
			t.Fatalf("counts %v: estimate %d for 200000", counts, n)
		}
		if counts && s.m["id-0"] != 3 {
			t.Fatalf("id-0 counted %d times, want 3", s.m["id-0"])
		}
		small := newIDSet(1000, maphash.MakeSeed(), counts)
		for i := 0; i < 999; i++ {
			small.add(fmt.Sprintf("id-%d", i%500), 1)
		}
		if small.count() != 500 || small.over {
			t.Fatalf("counts %v: exact count %d", counts, small.count())
		}
	}
}

// Memory is bounded by max_keys whatever the log holds: 5,000 clients
// through a store of 64 keys leave at most 64 keys, identities counted
// exactly up to 64 and estimated beyond, limited identities kept by name
// up to 64.
func TestMemoryBound(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 20_000; i++ {
		fmt.Fprintf(&b, "%s\n", nginxLine(fmt.Sprintf("10.0.%d.%d", i%5000/250, i%250), i/400, "/"))
	}
	cfg, err := policy.Parse([]byte("store: { max_keys: 64 }\nrules:\n  - name: ip\n    limit: 1/h\n    algorithm: fixed_window\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e, err := runEngine(context.Background(), []Input{{Name: "big.log", R: strings.NewReader(b.String())}}, []*config.Config{cfg}, Options{parts: 2})
	if err != nil {
		t.Fatal(err)
	}
	keys := 0
	for _, w := range e.workers {
		keys += w.sims[0].pol.Store().(*memstore.Store).Len()
	}
	if keys > 64 || len(e.workers) != 2 {
		t.Fatalf("the stores of %d workers hold %d keys, max_keys is 64", len(e.workers), keys)
	}
	rt := e.tallies[0].rules[0]
	if rt.ids.size() > 64 || rt.limitedIDs.size() > 64 {
		t.Fatalf("the tally holds %d identities and %d limited", rt.ids.size(), rt.limitedIDs.size())
	}
	r := e.tallies[0].report(&e.st).Rules[0]
	if !r.Approximate || r.Identities < 4800 || r.Identities > 5200 || r.Matched != 20_000 {
		t.Fatalf("%+v", r)
	}
}
