package weir_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
)

// TestLimitBuckets checks that ParseLimit and String carry a sliding
// window's buckets, and that Validate names a bad count.
func TestLimitBuckets(t *testing.T) {
	for _, s := range []string{"100/m buckets 6", "1000/h burst 50 buckets 4", "7/3s buckets 3"} {
		l, err := weir.ParseLimit(s)
		if err != nil {
			t.Fatalf("ParseLimit(%q): %v", s, err)
		}
		if got := l.String(); got != s {
			t.Errorf("ParseLimit(%q).String() = %q", s, got)
		}
	}
	if l, err := weir.ParseLimit("100/m buckets 6"); err != nil || l.Buckets != 6 || l.Rate != 100 || l.Period != time.Minute {
		t.Fatalf("ParseLimit: %+v, %v", l, err)
	}
	for s, want := range map[string]string{
		"5/m buckets 2 buckets 3": "buckets given twice",
		"5/m buckets 0":           `buckets "0" is not a positive whole number`,
		"5/m buckets x":           `buckets "x" is not a positive whole number`,
		"5/m buckets":             `unexpected "buckets"`,
	} {
		if _, err := weir.ParseLimit(s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseLimit(%q): got %v, want an error containing %q", s, err, want)
		}
	}
	for _, c := range []struct {
		l    weir.Limit
		want string
	}{
		{weir.Limit{Algorithm: weir.GCRA, Rate: 5, Period: time.Minute, Buckets: 4}, "buckets apply to sliding_window, not gcra"},
		{weir.Limit{Algorithm: weir.SlidingWindow, Rate: 5, Period: time.Minute, Buckets: 61}, "buckets must be 2 to 60, got 61"},
		{weir.Limit{Algorithm: weir.SlidingWindow, Rate: 5, Period: 1234567 * time.Microsecond, Buckets: 10}, "does not split into 10 buckets"},
	} {
		err := c.l.Validate()
		if !errors.Is(err, weir.ErrInvalidLimit) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "buckets") {
			t.Errorf("Validate(%+v): got %v, want ErrInvalidLimit containing %q", c.l, err, c.want)
		}
	}
	if err := (weir.Limit{Algorithm: weir.SlidingWindow, Rate: 100, Period: time.Minute, Buckets: 6}).Validate(); err != nil {
		t.Fatal(err)
	}
}
