package weir_test

import (
	"context"
	"testing"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// countingStore is a wrapper of the user's own: it counts takes and dates
// none (Result.At).
type countingStore struct {
	weir.Store
	takes int
}

func (c *countingStore) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	c.takes++
	return c.Store.Take(ctx, key, l, n)
}

func (c *countingStore) Do(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
	c.takes++
	err := c.Store.Do(ctx, reqs, res)
	for i := range res {
		res[i].At = 0
	}
	return err
}

// Reserve must not reach past a wrapper that cannot date takes to the
// store beneath it: that would skip the wrapper's own decision.
func TestReserveKeepsUserWrapper(t *testing.T) {
	ctx := context.Background()
	cs := &countingStore{Store: memstore.New()}
	lim := weir.NewLimiter(cs)
	l := weir.PerMinute(weir.FixedWindow, 10)
	r, res, err := lim.Reserve(ctx, "k", l, 4)
	if err != nil || r == nil || !res.Allowed {
		t.Fatalf("Reserve: %v %+v %v", r, res, err)
	}
	if cs.takes != 1 {
		t.Fatalf("the wrapper saw %d takes, want 1", cs.takes)
	}
	if !r.Stamp.IsZero() {
		t.Fatalf("a reservation through a wrapper that dates nothing is stamped: %+v", r.Stamp)
	}
	if _, err := r.Settle(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.Peek(ctx, "k", l); err != nil || res.Remaining != 9 {
		t.Fatalf("after settling 1 of 4: %+v %v, want 9 remaining", res, err)
	}
}
