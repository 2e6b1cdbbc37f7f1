package algorithm_test

import (
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// FuzzTake drives random limits through random operations and checks the
// invariants every algorithm must keep: no panic, Remaining within
// [0, Limit], Granted within [0, n], an admitted request has no RetryAfter,
// a rejected one a positive RetryAfter, and a rejection changes nothing.
func FuzzTake(f *testing.F) {
	f.Add(uint8(0), int64(5), int64(1000), int64(0), []byte{1, 2, 3, 200, 1, 0, 9})
	f.Add(uint8(5), int64(3), int64(10_000_000), int64(7), []byte{9, 9, 9, 9, 9, 250, 1})
	f.Fuzz(func(t *testing.T, kind uint8, rate, periodUS, burst int64, ops []byte) {
		algos := weir.Algorithms()
		l := weir.Limit{Algorithm: algos[int(kind)%len(algos)], Rate: rate, Period: time.Duration(periodUS) * time.Microsecond, Burst: burst}
		p, err := l.Compile()
		if err != nil {
			return // invalid limits are rejected, which is the point
		}
		var s algorithm.State
		now := int64(1_893_456_000_000_000)
		for i := 0; i+1 < len(ops); i += 2 {
			n := int64(ops[i]) % (p.MaxCost() + 1)
			now += int64(ops[i+1]) * max(periodUS/64, 1)
			mode := algorithm.Exact
			if ops[i]&0x80 != 0 {
				mode = algorithm.AtMost
			}
			before := s
			d := algorithm.Take(&p, &s, now, n, mode)
			if d.Remaining < 0 || d.Remaining > d.Limit || d.Granted < 0 || d.Granted > n {
				t.Fatalf("%v n=%d: %+v", l, n, d)
			}
			if d.Allowed && d.RetryAfter != 0 || !d.Allowed && n > 0 && d.RetryAfter <= 0 {
				t.Fatalf("%v n=%d: allowed=%v RetryAfter=%d", l, n, d.Allowed, d.RetryAfter)
			}
			if !d.Allowed && p.Block == 0 && (s.Count != before.Count || s.Level != before.Level || s.TAT != before.TAT || s.Frac != before.Frac) {
				t.Fatalf("%v n=%d: a rejection changed the state", l, n)
			}
		}
	})
}
