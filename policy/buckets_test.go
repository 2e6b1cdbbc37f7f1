package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy/config"
)

// TestParseBuckets checks buckets: on a sliding_window rule and its
// problems, each with its line and column and naming the bad value.
func TestParseBuckets(t *testing.T) {
	rule := func(body string) string { return "rules:\n  - name: r\n" + body }
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"buckets on gcra", rule("    limit: 5/m\n    buckets: 6\n"),
			[]string{`4:14: buckets 6: buckets apply only to sliding_window, not gcra`}},
		{"buckets in limit on fixed_window", rule("    limit: 5/m buckets 6\n    algorithm: fixed_window\n"),
			[]string{`3:12: buckets 6: buckets apply only to sliding_window, not fixed_window`}},
		{"one bucket", rule("    limit: 5/m\n    algorithm: sliding_window\n    buckets: 1\n"),
			[]string{`5:14: buckets 1 is out of range: a sliding_window takes 2 to 60 buckets`}},
		{"too many buckets", rule("    limit: 5/m\n    algorithm: sliding_window\n    buckets: 61\n"),
			[]string{`5:14: buckets 61 is out of range: a sliding_window takes 2 to 60 buckets`}},
		{"zero buckets", rule("    limit: 5/m\n    algorithm: sliding_window\n    buckets: 0\n"),
			[]string{`5:14: buckets must be at least 1, got 0`}},
		{"buckets not a number", rule("    limit: 5/m\n    algorithm: sliding_window\n    buckets: six\n"),
			[]string{`5:14: buckets must be a whole number, got "six"`}},
		{"buckets that do not divide the period", rule("    limit: 5/1234567us\n    algorithm: sliding_window\n    buckets: 10\n"),
			[]string{`5:14: buckets 10 do not split the period 1.234567s into whole microseconds; pick a count that divides it`}},
		{"buckets given twice", rule("    limit: 5/m buckets 4\n    algorithm: sliding_window\n    buckets: 6\n"),
			[]string{`5:5: buckets are given both in limit ("5/m buckets 4") and as buckets: 6; use one`}},
		{"buckets on a rule with tiers", rule("    algorithm: sliding_window\n    buckets: 6\n    tiers:\n      by: header:X-Plan\n      default: {limit: 5/m}\n"),
			[]string{`4:5: buckets and tiers are exclusive; give each tier its own buckets`}},
		{"buckets on a gcra tier", rule("    tiers:\n      by: header:X-Plan\n      default: {limit: 5/m, buckets: 4}\n"),
			[]string{`5:38: buckets 4: buckets apply only to sliding_window, not gcra`}},
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

// TestBucketsReachTheLimit checks that buckets: and "limit: ... buckets N",
// in a rule and in a tier, become the rule's weir.Limit.
func TestBucketsReachTheLimit(t *testing.T) {
	doc := `rules:
  - name: a
    limit: 100/m
    algorithm: sliding_window
    buckets: 6
  - name: b
    limit: 100/m buckets 12
    algorithm: sliding_window
  - name: c
    algorithm: sliding_window
    tiers:
      by: header:X-Plan
      default: {limit: 10/s, buckets: 5}
`
	cfg, err := Parse([]byte(doc), "ok.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "100/m buckets 6", "b": "100/m buckets 12", "c": "10/s buckets 5"}
	for _, r := range p.Rules() {
		if got := r.Limit; got != want[r.Name] {
			t.Errorf("rule %s: limit %q, want %q", r.Name, got, want[r.Name])
		}
	}
	l, err := weir.ParseLimit(want["a"])
	if err != nil || l.Buckets != 6 {
		t.Fatalf("ParseLimit(%q) = %+v, %v", want["a"], l, err)
	}
}
