package memstore

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// TestSameLimitKnowsEveryField changes each field of weir.Limit in turn
// (each element of an array) and requires sameLimit to tell the limits
// apart: a field added to Limit later fails here until sameLimit compares
// it. Equal limits whose strings are other copies of the same bytes are
// the same.
func TestSameLimitKnowsEveryField(t *testing.T) {
	base := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Second, Timezone: "Europe/Paris"}
	copyOf := base
	copyOf.Algorithm = weir.Algorithm(strings.Clone(string(base.Algorithm)))
	copyOf.Timezone = strings.Clone(base.Timezone)
	if !sameLimit(&base, &copyOf) || !sameLimit(&copyOf, &base) {
		t.Fatal("equal limits with copied strings differ")
	}
	typ := reflect.TypeOf(base)
	changed := 0
	for i := range typ.NumField() {
		f := typ.Field(i)
		for j := range max(1, arrayLen(f.Type)) {
			l := base
			v := reflect.ValueOf(&l).Elem().Field(i)
			if f.Type.Kind() == reflect.Array {
				v = v.Index(j)
			}
			switch v.Kind() {
			case reflect.String:
				v.SetString(v.String() + "x")
			case reflect.Int64:
				v.SetInt(v.Int() + 1)
			case reflect.Uint8:
				v.SetUint(v.Uint() + 1)
			default:
				t.Fatalf("Limit.%s: a field of kind %s, which this test does not change: teach it and sameLimit", f.Name, v.Kind())
			}
			if sameLimit(&base, &l) || sameLimit(&l, &base) {
				t.Errorf("Limit.%s (element %d) changed, but sameLimit reports the same limit", f.Name, j)
			}
			if l == base {
				t.Fatalf("Limit.%s: the test did not change it", f.Name)
			}
			changed++
		}
	}
	if changed < 14 {
		t.Fatalf("changed %d fields, want every one of Limit's", changed)
	}
}

func arrayLen(t reflect.Type) int {
	if t.Kind() == reflect.Array {
		return t.Len()
	}
	return 0
}

// TestPlainKeepsPacked checks what take's fast path relies on: under a
// limit plainOf accepts, every decision (Take or Check, exact, partial or
// a peek) on a packed state leaves a state that pack accepts, and packed
// gives the integers pack stores. It runs random workloads on every
// algorithm with each setting that changes what a state holds, switching
// the key between limits of one algorithm as a reload would; limits that
// plainOf refuses are run too, and at least one must leave the packed
// form (so that the test would see a state that does).
func TestPlainKeepsPacked(t *testing.T) {
	var variants []func(*weir.Limit)
	variants = append(variants,
		func(l *weir.Limit) {},
		func(l *weir.Limit) { l.Rate = 8 },
		func(l *weir.Limit) { l.Burst = 3 },
		func(l *weir.Limit) { l.Block = 2 * time.Second },
		func(l *weir.Limit) { l.Block, l.Escalate[0], l.ForgetAfter = time.Second, 5*time.Second, time.Minute },
		func(l *weir.Limit) { l.Buckets = 4 },
		func(l *weir.Limit) { l.Warmup = 10 * time.Second },
		func(l *weir.Limit) { l.MaxDelay, l.DelayAfter = time.Second, 2 },
		func(l *weir.Limit) { l.Calendar, l.Period = algorithm.CalendarDay, 0 },
	)
	refused, left := 0, 0
	for _, a := range weir.Algorithms() {
		var ps []algorithm.Params
		for _, v := range variants {
			l := weir.Limit{Algorithm: a, Rate: 5, Period: time.Second}
			v(&l)
			if p, err := l.Compile(); err == nil {
				ps = append(ps, p)
			}
		}
		for seed := range uint64(10) {
			rng := rand.New(rand.NewPCG(seed, 3))
			var st algorithm.State
			now := int64(1_893_456_000_000_000)
			for op := range 3000 {
				p := &ps[rng.IntN(len(ps))]
				lay := layoutOf(p)
				now += rng.Int64N(300_000)
				n := rng.Int64N(min(p.MaxCost(), 4) + 1)
				var v [3]int64
				if !pack(lay, &st, &v) {
					st = algorithm.State{} // left the packed form: start again
					continue
				}
				var d algorithm.Outcome
				if rng.IntN(4) == 0 {
					d = algorithm.Check(p, &st, now, n, algorithm.Mode(rng.IntN(2)))
				} else {
					algorithm.TakeTo(p, &st, now, n, algorithm.Mode(rng.IntN(2)), &d)
				}
				var after [3]int64
				ok := pack(lay, &st, &after)
				if !plainOf(p, lay) {
					refused++
					if !ok {
						left++
					}
					continue
				}
				if !ok {
					t.Fatalf("%s %+v seed %d op %d n=%d: plainOf accepts the limit, but a decision left a state that does not pack: %+v", a, p.Config, seed, op, n, st)
				}
				var got [3]int64
				if storePacked(lay, &st, &got); got != after {
					t.Fatalf("%s seed %d op %d: storePacked gives %v, pack %v", a, seed, op, got, after)
				}
			}
		}
	}
	if refused == 0 || left == 0 {
		t.Fatalf("limits plainOf refuses: %d decisions, %d of which left the packed form; want some of both", refused, left)
	}
}
