package denycache

import (
	"testing"

	"github.com/weir-dev/weir"
)

// TestTakeStamped: a reservation through the deny cache is dated by the
// wrapped store's clock, and its denial is kept and then answered from
// memory (with no stamp), as Take's is.
func TestTakeStamped(t *testing.T) {
	s, _, clock := newMem(t, 0)
	res, st, err := s.TakeStamped(ctx, "a", fw, 3)
	if err != nil || !res.Allowed || st != (weir.Stamp{At: clock.Now().UnixMicro(), Estimate: 3, Remaining: 0}) {
		t.Fatalf("an admitted dated take: %+v %+v %v", res, st, err)
	}
	for i := range 2 {
		res, st, err = s.TakeStamped(ctx, "a", fw, 1)
		if err != nil || res.Allowed || !st.IsZero() {
			t.Fatalf("denial %d: %+v %+v %v", i, res, st, err)
		}
	}
	if hits := s.Stats().Hits; hits != 1 {
		t.Fatalf("the second denial was not answered from memory: %d hits, want 1", hits)
	}
	if _, ok := any(s).(weir.StampStore); !ok {
		t.Fatal("the deny cache is no StampStore")
	}
}
