package localbudget_test

import (
	"context"
	"fmt"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/localbudget"
	"github.com/weir-dev/weir/store/memstore"
)

// A hot key under a limit of 1000 a minute, shared by the fleet through
// one store: each instance takes 100 units at once and spends them
// locally, so the store sees one call per 100 decisions.
func ExampleTable_Take() {
	store := memstore.New() // redisstore.New(...) in a fleet
	leases := localbudget.New(localbudget.Config{})
	global := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1000, Period: time.Minute}
	size := localbudget.Size(100, global, 4) // 100: under 1000 / 4 instances
	ctx := context.Background()
	for range 3 {
		r, err := leases.Take(ctx, store, "tenant:acme", global, 1, size)
		if err != nil {
			panic(err) // a store error: apply the rule's on_error
		}
		fmt.Println(r.Allowed)
	}
	s := leases.Stats()
	fmt.Printf("taken %d, spent %d, store calls %d\n", s.Taken, s.Spent, s.Calls)
	// Output:
	// true
	// true
	// true
	// taken 100, spent 3, store calls 1
}
