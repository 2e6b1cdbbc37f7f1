package weir_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

func TestParseLimit(t *testing.T) {
	for _, tc := range []struct {
		in     string
		rate   int64
		period time.Duration
		burst  int64
	}{
		{"100/s", 100, time.Second, 0},
		{"100/m", 100, time.Minute, 0},
		{"5/15m", 5, 15 * time.Minute, 0},
		{"1000/h", 1000, time.Hour, 0},
		{"20/30s", 20, 30 * time.Second, 0},
		{"10/d", 10, 24 * time.Hour, 0},
		{"7/7d", 7, 7 * 24 * time.Hour, 0},
		{"3/90m", 3, 90 * time.Minute, 0},
		{"3/1h30m", 3, 90 * time.Minute, 0},
		{"1000/h burst 50", 1000, time.Hour, 50},
		{"  2/minute  burst 9 ", 2, time.Minute, 9},
		{"5/250ms", 5, 250 * time.Millisecond, 0},
	} {
		l, err := weir.ParseLimit(tc.in)
		if err != nil {
			t.Errorf("ParseLimit(%q): %v", tc.in, err)
			continue
		}
		if l.Rate != tc.rate || l.Period != tc.period || l.Burst != tc.burst {
			t.Errorf("ParseLimit(%q) = %+v", tc.in, l)
		}
	}
}

func TestParseLimitErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "empty"},
		{"100", "missing '/'"},
		{"0/m", "rate must be positive, got 0"},
		{"-5/m", "rate must be positive, got -5"},
		{"abc/m", `rate "abc" is not a whole number`},
		{"99999999999999999999/s", `is not a whole number`},
		{"9007199254740993/s", "too large"},
		{"5/", "missing period"},
		{"5/x", `period "x" is not a duration`},
		{"5/10", `period "10" has no unit`},
		{"5/-1s", `period "-1s" must be positive`},
		{"5/0s", `period "0s" must be positive`},
		{"5/0d", "days must be a positive whole number"},
		{"5/1ns", "whole number of microseconds"},
		{"5/m burst", `unexpected "burst"`},
		{"5/m burst 0", `burst "0" is not a positive`},
		{"5/m burst -2", `burst "-2" is not a positive`},
		{"5/m burst 2 burst 3", "burst given twice"},
		{"5/m nodelay", `unexpected "nodelay"`},
	} {
		_, err := weir.ParseLimit(tc.in)
		if err == nil {
			t.Errorf("ParseLimit(%q): no error", tc.in)
			continue
		}
		if !errors.Is(err, weir.ErrInvalidLimit) {
			t.Errorf("ParseLimit(%q): %v does not wrap ErrInvalidLimit", tc.in, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.want) || !strings.Contains(msg, `"`+tc.in+`"`) {
			t.Errorf("ParseLimit(%q) error %q: want it to quote the input and say %q", tc.in, msg, tc.want)
		}
	}
}

func TestLimitStringRoundTrip(t *testing.T) {
	for _, s := range []string{"100/s", "100/m", "5/15m", "1000/h", "20/30s", "10/d", "7/7d", "1000/h burst 50", "5/250ms"} {
		l, err := weir.ParseLimit(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := l.String(); got != s {
			t.Errorf("String of %q = %q", s, got)
		}
	}
}

func TestLimitValidate(t *testing.T) {
	for _, tc := range []struct {
		l    weir.Limit
		want string
	}{
		{weir.Limit{Algorithm: "leaky", Rate: 1, Period: time.Second}, `unknown algorithm "leaky"`},
		{weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: time.Second, Burst: 10}, "burst applies to token_bucket"},
		{weir.Limit{Algorithm: weir.GCRA, Rate: 5, Period: time.Second, MaxDelay: time.Second}, "apply to leaky_bucket"},
		{weir.Limit{Algorithm: weir.LeakyBucket, Rate: 5, Period: time.Second, DelayAfter: 2}, "needs a max delay"},
		{weir.Limit{Algorithm: weir.LeakyBucket, Rate: 5, Period: time.Second, MaxDelay: time.Second, DelayAfter: 9}, "exceeds the burst"},
		{weir.Limit{Algorithm: weir.SlidingLog, Rate: 2_000_000, Period: time.Second}, "use sliding_window"},
		{weir.Limit{Algorithm: weir.GCRA, Rate: 5, Period: 1500 * time.Nanosecond}, "whole number of microseconds"},
		{weir.Limit{Algorithm: weir.GCRA, Rate: 9_999_991, Period: 365 * 24 * time.Hour, Burst: 1_000_000}, "too large to track exactly"},
	} {
		err := tc.l.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, weir.ErrInvalidLimit) {
			t.Errorf("Validate(%+v) = %v, want an ErrInvalidLimit saying %q", tc.l, err, tc.want)
		}
	}
	// A rate over a million per second is exact: the emission interval is below 1µs.
	if err := (weir.Limit{Algorithm: weir.GCRA, Rate: 3_000_000, Period: time.Second}).Validate(); err != nil {
		t.Errorf("3M/s: %v", err)
	}
	// The zero algorithm is GCRA.
	if err := (weir.Limit{Rate: 5, Period: time.Second}).Validate(); err != nil {
		t.Errorf("zero algorithm: %v", err)
	}
}

func TestLimitPeriodBound(t *testing.T) {
	if err := (weir.Limit{Rate: 1, Period: 11 * 366 * 24 * time.Hour}).Validate(); err == nil || !strings.Contains(err.Error(), "at most 10 years") {
		t.Fatalf("an 11-year period: %v", err)
	}
}

func TestParseCalendarLimit(t *testing.T) {
	for in, want := range map[string]weir.Limit{
		"10000/month": {Rate: 10000, Period: 31 * 24 * time.Hour, Calendar: algorithm.CalendarMonth},
		"500/week":    {Rate: 500, Period: 7 * 24 * time.Hour, Calendar: algorithm.CalendarWeek},
		"10/day":      {Rate: 10, Period: 24 * time.Hour},
	} {
		l, err := weir.ParseLimit(in)
		if err != nil || l != want || l.String() != strings.Replace(in, "/day", "/d", 1) {
			t.Errorf("ParseLimit(%q) = %+v (%q), %v; want %+v", in, l, l.String(), err, want)
		}
	}
	l, _ := weir.ParseLimit("10/month")
	l.Algorithm = weir.GCRA
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "apply to fixed_window, not gcra") {
		t.Errorf("10/month on gcra: %v", err)
	}
	l.Algorithm, l.Timezone = weir.FixedWindow, "Nowhere/Else"
	var le *weir.LimitError
	if err := l.Validate(); !errors.As(err, &le) || le.Field != "timezone" {
		t.Errorf("unknown zone: %v", err)
	}
}

// TestUnknownAlgorithmMessage: an unknown algorithm is reported as such,
// not as an invalid limit, and is still an ErrInvalidLimit.
func TestUnknownAlgorithmMessage(t *testing.T) {
	err := weir.Limit{Algorithm: "gcraa", Rate: 5, Period: time.Minute}.Validate()
	want := `weir: unknown algorithm "gcraa" (want one of fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, gcra, concurrency)`
	if err == nil || err.Error() != want || !errors.Is(err, weir.ErrInvalidLimit) {
		t.Fatalf("Validate = %v, want an ErrInvalidLimit saying %s", err, want)
	}
}
