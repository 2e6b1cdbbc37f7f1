package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestReportDeterministic runs a small trace twice: the same flags must
// print the same table, and the exact log must never exceed the limit
// (report fails if it does).
func TestReportDeterministic(t *testing.T) {
	tr := trace{Seed: 3, Clients: 12, Minutes: 6, Rate: 20, Sigma: 0.6, Warmup: 1}
	var a, b bytes.Buffer
	if err := report(&a, tr, 2, []int{2, 5}); err != nil {
		t.Fatal(err)
	}
	if err := report(&b, tr, 2, []int{2, 5}); err != nil {
		t.Fatal(err)
	}
	if a.String() != b.String() {
		t.Fatalf("two runs of one trace differ:\n%s\n%s", a.String(), b.String())
	}
	for _, want := range []string{"sliding_log", "sliding_window buckets 5", "over 2 seeds (3..4)"} {
		if !strings.Contains(a.String(), want) {
			t.Fatalf("report lacks %q:\n%s", want, a.String())
		}
	}
	var s3, s4 bytes.Buffer
	if err := report(&s3, tr, 1, nil); err != nil {
		t.Fatal(err)
	}
	tr.Seed = 4
	if err := report(&s4, tr, 1, nil); err != nil {
		t.Fatal(err)
	}
	if s3.String() == s4.String() {
		t.Fatal("seeds 3 and 4 printed the same table")
	}
}

// TestBadBuckets checks that a bucket count the limit cannot take is an
// error naming it, not a panic.
func TestBadBuckets(t *testing.T) {
	tr := trace{Seed: 1, Clients: 2, Minutes: 2, Rate: 10, Sigma: 0.5, Warmup: 1}
	var out bytes.Buffer
	err := report(&out, tr, 1, []int{7})
	if err == nil || !strings.Contains(err.Error(), "7 buckets") {
		t.Fatalf("got %v, want an error naming 7 buckets", err)
	}
	if _, err := parseBuckets("4,x"); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("parseBuckets: %v", err)
	}
}
