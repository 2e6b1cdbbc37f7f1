package denycache_test

import (
	"context"
	"fmt"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/denycache"
	"github.com/weir-dev/weir/store/memstore"
)

// A deny cache in front of a store. In a fleet, wrap a redisstore.Store and
// give every instance a Bus on the store's client:
//
//	bus := denycache.NewRedisBus(rs.Client(), denycache.RedisBusConfig{Channel: "weir:denycache"})
//	cache, err := denycache.New(rs, denycache.Config{Bus: bus})
func Example() {
	ctx := context.Background()
	cache, err := denycache.New(memstore.New(), denycache.Config{Size: 10_000})
	if err != nil {
		panic(err)
	}
	defer cache.Close()
	lim := weir.NewLimiter(cache)
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Period: time.Hour}
	for range 5 {
		res, _ := lim.Allow(ctx, "client-1", l)
		fmt.Println(res.Allowed)
	}
	fmt.Println("answered from memory:", cache.Stats().Hits)
	_ = lim.Reset(ctx, "client-1", l) // drops the entry (and publishes it, with a Bus)
	res, _ := lim.Allow(ctx, "client-1", l)
	fmt.Println("after a reset:", res.Allowed)
	// Output:
	// true
	// true
	// false
	// false
	// false
	// answered from memory: 2
	// after a reset: true
}
