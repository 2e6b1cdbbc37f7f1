package weir_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// TestSetOutcomeSetsEveryField: SetOutcome on a Result that holds other
// values gives what ResultOf gives, for a Decision with each field set
// and for the zero Decision, and ResultOf converts every field.
func TestSetOutcomeSetsEveryField(t *testing.T) {
	full := algorithm.Outcome{Allowed: true, Granted: 2, Limit: 3, Remaining: 4, RetryAfter: 5, ResetAfter: 6, Delay: 7, BlockedUntil: 8, TTL: 9}
	want := weir.Result{Allowed: true, Granted: 2, Limit: 3, Remaining: 4, RetryAfter: 5 * time.Microsecond, ResetAfter: 6 * time.Microsecond,
		Delay: 7 * time.Microsecond, BlockedUntil: time.UnixMicro(8)}
	if got := weir.ResultOf(full); !reflect.DeepEqual(got, want) {
		t.Fatalf("ResultOf(%+v) = %+v, want %+v", full, got, want)
	}
	// Every field of Result differs between the two, so a field that
	// SetOutcome left alone shows.
	other := weir.Result{Granted: -1, Limit: -1, Remaining: -1, RetryAfter: -1, ResetAfter: -1, Delay: -1, BlockedUntil: time.UnixMicro(99), At: -1}
	rt := reflect.TypeFor[weir.Result]()
	for i := range rt.NumField() {
		if reflect.ValueOf(want).Field(i).Equal(reflect.ValueOf(other).Field(i)) {
			t.Fatalf("the test's Results agree on %s", rt.Field(i).Name)
		}
	}
	for _, d := range []algorithm.Outcome{full, {}} {
		r := other
		r.SetOutcome(&d)
		if want := weir.ResultOf(d); !reflect.DeepEqual(r, want) {
			t.Errorf("SetOutcome(%+v) over another Result = %+v, want %+v", d, r, want)
		}
		r = want
		r.SetOutcome(&d)
		if want := weir.ResultOf(d); !reflect.DeepEqual(r, want) {
			t.Errorf("SetOutcome(%+v) = %+v, want %+v", d, r, want)
		}
	}
}
