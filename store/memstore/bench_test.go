package memstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

func benchLimit(a weir.Algorithm) weir.Limit {
	// A limit high enough that most decisions admit, and long enough that
	// no key's state expires during the run (so every decision after the
	// warm-up finds its key).
	l := weir.Limit{Algorithm: a, Rate: 1_000_000_000, Period: 24 * time.Hour}
	if a == weir.SlidingLog || a == weir.Concurrency {
		// These keep one entry per admitted event: use a small limit that
		// is soon exhausted, which measures the rejection path.
		l.Rate = 100
	}
	return l
}

// BenchmarkAllow measures one goroutine deciding on one key.
func BenchmarkAllow(b *testing.B) {
	for _, a := range weir.Algorithms() {
		b.Run(string(a), func(b *testing.B) {
			lim := weir.NewLimiter(memstore.New())
			l := benchLimit(a)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				lim.Allow(ctx, "key", l)
			}
		})
	}
}

// BenchmarkAllowParallel measures all cores deciding over 100k keys.
func BenchmarkAllowParallel(b *testing.B) {
	const nkeys = 100_000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	for _, a := range weir.Algorithms() {
		b.Run(string(a), func(b *testing.B) {
			lim := weir.NewLimiter(memstore.New())
			l := benchLimit(a)
			ctx := context.Background()
			for _, k := range keys { // warm: every key exists
				lim.Allow(ctx, k, l)
			}
			var seq atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := seq.Add(7919) // each goroutine starts elsewhere
				for pb.Next() {
					i = i*6364136223846793005 + 1442695040888963407
					lim.Allow(ctx, keys[(i>>33)%nkeys], l)
				}
			})
		})
	}
}
