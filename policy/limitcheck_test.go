package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy/config"
)

// TestBlockWithConcurrency: a penalty box applies to every algorithm, as
// algorithm.Compile says (the conformance suite checks the box of a
// concurrency limit on both stores), so a rule may set one on a
// concurrency limit, and its limit carries it.
func TestBlockWithConcurrency(t *testing.T) {
	doc := "rules:\n  - name: r\n    limit: 5/m\n    algorithm: concurrency\n    block: 1m\n"
	cfg, err := Parse([]byte(doc), "w.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rep plain
	c := check(cfg, &rep)
	if len(rep.problems) != 0 {
		t.Fatalf("problems: %+v", rep.problems)
	}
	if l := c.rules[0].tiers[0].limit; l.Block != time.Minute || l.Algorithm != "concurrency" {
		t.Fatalf("limit %+v, want a concurrency limit with a 1m block", l)
	}
}

// TestLimitProblemAtItsKey: a problem Compile finds with a setting given
// as a key of its own is reported at that key, not at limit.
func TestLimitProblemAtItsKey(t *testing.T) {
	rule := func(body string) string { return "rules:\n  - name: r\n" + body }
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"block over ten years", rule("    limit: 5/m\n    block: 4000d\n"),
			[]string{`4:12: invalid limit "5/m": period, block and max delay must be at most 10 years, got 60000000µs, 345600000000000µs and 0µs`}},
		{"delay_after over the burst", rule("    limit: 5/m\n    algorithm: leaky_bucket\n    max_delay: 1s\n    delay_after: 9\n"),
			[]string{`6:18: invalid limit "5/m": leaky_bucket: delay-after 9 exceeds the burst 5`}},
		{"burst too large to be exact", rule("    limit: 9999991/365d\n    burst: 1000000\n"),
			[]string{`4:12: invalid limit "9999991/365d burst 1000000": gcra: burst 1000000 × interval 31536000000000/9999991µs is too large to track exactly (lower the burst, or pick a rate that divides the period)`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.doc), "w.yaml")
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("got %+v, %v; want a *config.Error", cfg, err)
			}
			var got []string
			for _, line := range ce.Lines() {
				got = append(got, strings.TrimPrefix(line, "w.yaml:"))
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("problems:\n got %q\nwant %q", got, c.want)
			}
		})
	}
}
