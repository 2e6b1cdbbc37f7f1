package guard

import (
	"context"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// deadlineSeen is a store that records whether its calls' contexts had a
// deadline.
type deadlineSeen struct {
	weir.Store
	had bool
}

func (d *deadlineSeen) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	_, d.had = ctx.Deadline()
	return d.Store.Take(ctx, key, l, n)
}

func (d *deadlineSeen) Do(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
	_, d.had = ctx.Deadline()
	return d.Store.Do(ctx, reqs, res)
}

// TestDeadlineFromConfig: the guard sets its deadline on every call unless
// its config says the store never waits (NoDeadline) or ends its calls by
// a deadline of its own no longer than the guard's (StoreTimeout); it
// learns neither by looking at the store.
func TestDeadlineFromConfig(t *testing.T) {
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Minute}
	for _, c := range []struct {
		name string
		cfg  Config
		want bool
	}{
		{"default", Config{}, true},
		{"no deadline", Config{NoDeadline: true}, false},
		{"the store's own, shorter", Config{Timeout: time.Second, StoreTimeout: 100 * time.Millisecond}, false},
		{"the store's own, longer", Config{Timeout: 100 * time.Millisecond, StoreTimeout: time.Second}, true},
	} {
		st := &deadlineSeen{Store: memstore.New()}
		g := New(st, c.cfg)
		if _, err := g.Take(context.Background(), "k", l, 1); err != nil {
			t.Fatal(err)
		}
		if st.had != c.want {
			t.Errorf("%s: Take's context had a deadline: %v, want %v", c.name, st.had, c.want)
		}
		st.had = !c.want
		if err := g.Do(context.Background(), []weir.Request{{Key: "k", Limit: l, N: 1}}, make([]weir.Result, 1)); err != nil {
			t.Fatal(err)
		}
		if st.had != c.want {
			t.Errorf("%s: Do's context had a deadline: %v, want %v", c.name, st.had, c.want)
		}
	}
}
