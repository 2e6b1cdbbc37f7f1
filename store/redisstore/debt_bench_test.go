package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
)

// BenchmarkDebt compares a debit and a settlement with a take through
// Redis, from 1 and 16 goroutines sharing one Store, on keys drawn from
// 100k (make bench-debt). Each is one script call (coalesced into batches
// under concurrency); the Lua of a debit reads the state, decides twice
// (before and after) and writes once. Settle is the debit of 3 over an
// estimate of 5.
func BenchmarkDebt(b *testing.B) {
	addr := os.Getenv(benchEnv)
	if addr == "" {
		addr = redistest.Standalone(b).Addr
	}
	s, err := New(context.Background(), Config{Addrs: []string{addr}, Prefix: "gobenchdebt", Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	lim := weir.NewLimiter(s)
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "d" + strconv.Itoa(i)
	}
	ctx := context.Background()
	for _, a := range []weir.Algorithm{weir.GCRA, weir.FixedWindow} {
		l := benchLimit(a)
		for _, op := range []struct {
			name string
			fn   func(key string) error
		}{
			{"Take", func(k string) error { _, err := lim.AllowN(ctx, k, l, 1); return err }},
			{"Debit", func(k string) error { _, err := lim.Debit(ctx, k, l, 1); return err }},
			{"Settle", func(k string) error { _, err := lim.Settle(ctx, k, l, 5, 8); return err }},
		} {
			for _, g := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/%s/g=%d", a, op.name, g), func(b *testing.B) {
					var next atomic.Int64
					var failed atomic.Value
					var wg sync.WaitGroup
					b.ResetTimer()
					start := time.Now()
					for w := range g {
						wg.Add(1)
						go func() {
							defer wg.Done()
							rng := rand.New(rand.NewPCG(uint64(w), 2))
							for next.Add(1) <= int64(b.N) {
								if err := op.fn(keys[rng.IntN(len(keys))]); err != nil {
									failed.CompareAndSwap(nil, err)
									return
								}
							}
						}()
					}
					wg.Wait()
					if err, _ := failed.Load().(error); err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/decision")
				})
			}
		}
	}
}
