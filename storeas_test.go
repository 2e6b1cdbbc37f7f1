package weir_test

import (
	"context"
	"testing"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// wrapper is a store wrapper that offers Unwrap, as the deny cache does.
type wrapper struct{ weir.Store }

func (w wrapper) Unwrap() weir.Store { return w.Store }

func TestStoreAs(t *testing.T) {
	ms := memstore.New()
	if got, ok := weir.StoreAs[*memstore.Store](wrapper{wrapper{ms}}); !ok || got != ms {
		t.Fatalf("through two wrappers: %v %v, want the memstore", got, ok)
	}
	if _, ok := weir.StoreAs[weir.ReservationStore](wrapper{ms}); !ok {
		t.Fatal("an interface the wrapped store implements was not found")
	}
	if _, ok := weir.StoreAs[interface{ Nope() }](wrapper{ms}); ok {
		t.Fatal("found an interface nothing implements")
	}
}

// countingStore is a wrapper of the user's own: it counts takes, offers
// Unwrap, and does not implement weir.StampStore.
type countingStore struct {
	weir.MultiStore
	takes int
}

func (c *countingStore) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	c.takes++
	return c.MultiStore.Take(ctx, key, l, n)
}

func (c *countingStore) Unwrap() weir.Store { return c.MultiStore }

// Reserve must not reach past a wrapper that cannot date takes to the
// StampStore beneath it: that would skip the wrapper's own Take.
func TestReserveKeepsUserWrapper(t *testing.T) {
	ctx := context.Background()
	cs := &countingStore{MultiStore: memstore.New()}
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
