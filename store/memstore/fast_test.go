package memstore

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
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
