package weir_test

import (
	"context"
	"fmt"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// A fixed clock keeps the examples' output stable.
func fixedClock() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }

func ExampleLimiter_Allow() {
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(fixedClock)))
	login := weir.Limit{Algorithm: weir.SlidingLog, Rate: 3, Period: 15 * time.Minute}
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		res, err := lim.Allow(ctx, weir.Key("login", "203.0.113.7"), login)
		if err != nil {
			panic(err)
		}
		fmt.Printf("attempt %d: allowed=%v remaining=%d retry_after=%v\n", i, res.Allowed, res.Remaining, res.RetryAfter)
	}
	// Output:
	// attempt 1: allowed=true remaining=2 retry_after=0s
	// attempt 2: allowed=true remaining=1 retry_after=0s
	// attempt 3: allowed=true remaining=0 retry_after=0s
	// attempt 4: allowed=false remaining=0 retry_after=15m0s
}

func ExampleParseLimit() {
	l, err := weir.ParseLimit("1000/h burst 50")
	fmt.Println(l.Rate, l.Period, l.Burst, err)
	_, err = weir.ParseLimit("5/fortnight")
	fmt.Println(err)
	// Output:
	// 1000 1h0m0s 50 <nil>
	// weir: invalid limit "5/fortnight": period "fortnight" is not a duration (use s, m, h, d, 30s, 15m, 7d)
}

// The penalty box: after the first rejection the key stays locked.
func ExampleLimit_block() {
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(fixedClock)))
	otp := weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Period: 30 * time.Minute, Block: 30 * time.Minute}
	key := weir.Key("otp", "user-42")
	for i := 0; i < 4; i++ {
		lim.Allow(context.Background(), key, otp)
	}
	res, _ := lim.Allow(context.Background(), key, otp)
	fmt.Println(res.Allowed, res.BlockedUntil.Format(time.RFC3339))
	// Output: false 2030-01-01T00:30:00Z
}

func ExampleLimiter_AllowAtMost() {
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(fixedClock)))
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 100, Period: time.Second, Burst: 150}
	res, _ := lim.AllowAtMost(context.Background(), "batch-worker", l, 400)
	fmt.Println("granted", res.Granted, "of 400")
	// Output: granted 150 of 400
}

func ExampleLimiter_Acquire() {
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(fixedClock)))
	// At most 2 exports at once per tenant; a crashed holder's lease expires after 5 minutes.
	exports := weir.Limit{Algorithm: weir.Concurrency, Rate: 2, Period: 5 * time.Minute}
	ctx := context.Background()
	a, _, _ := lim.Acquire(ctx, "tenant-7", exports)
	b, _, _ := lim.Acquire(ctx, "tenant-7", exports)
	c, res, _ := lim.Acquire(ctx, "tenant-7", exports)
	fmt.Println(a != nil, b != nil, c != nil, res.RetryAfter)
	a.Release(ctx)
	c, _, _ = lim.Acquire(ctx, "tenant-7", exports)
	fmt.Println(c != nil)
	// Output:
	// true true false 5m0s
	// true
}

// A shaping leaky bucket delays requests instead of rejecting them, like
// nginx's limit_req with burst and no nodelay.
func ExampleLimit_shaping() {
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(fixedClock)))
	l := weir.Limit{Algorithm: weir.LeakyBucket, Rate: 2, Period: time.Second, Burst: 4, MaxDelay: 2 * time.Second}
	for i := 0; i < 5; i++ {
		res, _ := lim.Allow(context.Background(), "upstream", l)
		fmt.Println(res.Allowed, res.Delay)
	}
	// Output:
	// true 0s
	// true 500ms
	// true 1s
	// true 1.5s
	// false 0s
}

func ExampleKey() {
	fmt.Println(weir.Key("login", "203.0.113.7"))
	fmt.Println(weir.Key("promo", "member:42", "SPRING{24}"))
	// Output:
	// login:203.0.113.7
	// promo:member%3A42:SPRING%7B24%7D
}
