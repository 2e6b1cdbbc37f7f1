package weir_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/weir-dev/weir"
)

// FuzzParseLimit: any input either parses into a valid, round-tripping
// limit or fails with an ErrInvalidLimit that quotes it; it never panics.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"100/s", "5/15m", "1000/h burst 50", "10/d", "0/m", "5/", "x/y", "9/1h30m", "3/250ms burst 2", "1/-1s", "5/99999999999999d", "10000/month", "500/week"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := weir.ParseLimit(s)
		if err != nil {
			if !errors.Is(err, weir.ErrInvalidLimit) || !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("ParseLimit(%q): error %q does not quote the input", s, err)
			}
			return
		}
		if l.Rate <= 0 || l.Period <= 0 || l.Burst < 0 {
			t.Fatalf("ParseLimit(%q) = %+v", s, l)
		}
		back, err := weir.ParseLimit(l.String())
		if err != nil || back != l {
			t.Fatalf("round trip of %q via %q: %+v %v", s, l.String(), back, err)
		}
	})
}

// FuzzKey: keys never contain braces or control bytes, and distinct part
// lists never share a key.
func FuzzKey(f *testing.F) {
	f.Add("login", "1.2.3.4", "x")
	f.Add("a:b", "", "{c}")
	f.Fuzz(func(t *testing.T, rule, a, b string) {
		k1 := weir.Key(rule, a, b)
		if strings.ContainsAny(k1, "{}\n\x00") {
			t.Fatalf("Key(%q, %q, %q) = %q", rule, a, b, k1)
		}
		if a+b != "" {
			if k2 := weir.Key(rule, a+b); k1 == k2 {
				t.Fatalf("Key(%q, %q, %q) == Key(%q, %q)", rule, a, b, rule, a+b)
			}
		}
	})
}
