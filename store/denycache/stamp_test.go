package denycache

import (
	"context"
	"testing"
	"time"

	"github.com/weir-dev/weir"
)

// TestTakeStamped: a reservation through the deny cache is dated by the
// wrapped store's clock, and its denial is kept and then answered from
// memory (with no stamp), as Take's is.
func TestTakeStamped(t *testing.T) {
	s, _, clock := newMem(t, 0)
	res, st, err := takeStamped(s, ctx, "a", fw, 3)
	if err != nil || !res.Allowed || st != (weir.Stamp{At: clock.Now().UnixMicro(), Estimate: 3, Remaining: 0}) {
		t.Fatalf("an admitted dated take: %+v %+v %v", res, st, err)
	}
	for i := range 2 {
		res, st, err = takeStamped(s, ctx, "a", fw, 1)
		if err != nil || res.Allowed || !st.IsZero() {
			t.Fatalf("denial %d: %+v %+v %v", i, res, st, err)
		}
	}
	if hits := s.Stats().Hits; hits != 1 {
		t.Fatalf("the second denial was not answered from memory: %d hits, want 1", hits)
	}
}

// TestTakeAllStamped: a stamped batch through the deny cache is dated by
// the wrapped store's clock; a batch of one is TakeStamped, whose denial
// is kept and then answered from memory (with no stamp).
func TestTakeAllStamped(t *testing.T) {
	s, _, clock := newMem(t, 0)
	wide := weir.Limit{Algorithm: weir.GCRA, Rate: 100, Period: time.Second}
	reqs := []weir.Request{{Key: "a", Limit: wide, N: 1}, {Key: "a", Limit: fw, N: 2}}
	res := make([]weir.Result, 2)
	stamps := make([]weir.Stamp, 2)
	if err := takeAllStamped(s, ctx, reqs, res, stamps); err != nil || !res[1].Allowed {
		t.Fatalf("an admitted batch: %+v %v", res, err)
	}
	at := clock.Now().UnixMicro()
	if stamps[0] != (weir.Stamp{At: at, Estimate: 1, Remaining: 99}) || stamps[1] != (weir.Stamp{At: at, Estimate: 2, Remaining: 1}) {
		t.Fatalf("the batch's stamps: %+v", stamps)
	}
	one := reqs[1:]
	one[0].N = 1
	if err := takeAllStamped(s, ctx, one, res, stamps); err != nil || stamps[0] != (weir.Stamp{At: at, Estimate: 1, Remaining: 0}) {
		t.Fatalf("a batch of one: %+v %+v %v", res[0], stamps[0], err)
	}
	for i := range 2 {
		stamps[0] = weir.Stamp{At: 1}
		if err := takeAllStamped(s, ctx, one, res, stamps); err != nil || res[0].Allowed || !stamps[0].IsZero() {
			t.Fatalf("denial %d: %+v %+v %v", i, res[0], stamps[0], err)
		}
	}
	if hits := s.Stats().Hits; hits != 1 {
		t.Fatalf("the second denial was not answered from memory: %d hits, want 1", hits)
	}
}

// takeStamped takes n through s.Do and returns the take's Stamp.
func takeStamped(s *Store, ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, weir.Stamp, error) {
	res := make([]weir.Result, 1)
	err := s.Do(ctx, []weir.Request{{Key: key, Limit: l, N: n}}, res)
	return res[0], res[0].Stamp(n), err
}

// takeAllStamped decides reqs through s.Do and sets their Stamps.
func takeAllStamped(s *Store, ctx context.Context, reqs []weir.Request, res []weir.Result, stamps []weir.Stamp) error {
	err := s.Do(ctx, reqs, res)
	for i := range reqs {
		stamps[i] = res[i].Stamp(reqs[i].N)
	}
	return err
}
