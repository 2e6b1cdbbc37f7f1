package localbudget_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/localbudget"
	"github.com/weir-dev/weir/store/memstore"
)

// gated holds the first TakeAll's reply until gate closes.
type gated struct {
	weir.Store
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
}

func (g *gated) Do(ctx context.Context, reqs []weir.Request, out []weir.Result) error {
	err := g.Store.Do(ctx, reqs, out)
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.gate
	}
	return err
}

// TestForgetDuringRefill: a reset (Forget) while a refill is out: the
// units that refill debited before the reset lapse, and neither its caller
// nor those waiting for it spend them; after the reset the key admits its
// limit once. (The waiters are given time to queue; if one has not, the
// test only checks less.)
func TestForgetDuringRefill(t *testing.T) {
	c := &clock{t: time.Date(2030, 1, 1, 1, 0, 0, 0, time.UTC)}
	ms := memstore.New(memstore.WithClock(c.now))
	g := &gated{Store: ms, entered: make(chan struct{}), gate: make(chan struct{})}
	tbl := localbudget.New(localbudget.Config{Now: c.now})
	l := weir.Limit{Rate: 10, Period: time.Hour, Algorithm: weir.FixedWindow}
	ctx := context.Background()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if r, _ := tbl.Take(ctx, g, "k", l, 1, 10); r.Allowed {
			admitted.Add(1)
		}
	}()
	<-g.entered
	for range 9 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, _ := tbl.Take(ctx, g, "k", l, 1, 10)
			if r.Allowed {
				admitted.Add(1)
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	// The reset, as policy.Reset makes it: the store, then the table.
	if err := weir.NewLimiter(ms).Reset(ctx, "k", l); err != nil {
		t.Fatal(err)
	}
	tbl.Forget("k", l)
	close(g.gate)
	wg.Wait()
	for range 20 {
		r, _ := tbl.Take(ctx, g, "k", l, 1, 10)
		if r.Allowed {
			admitted.Add(1)
		}
	}
	if got := admitted.Load(); got != 10 {
		t.Errorf("admitted %d across a reset during a refill, want exactly the limit of 10 after it", got)
	}
}
