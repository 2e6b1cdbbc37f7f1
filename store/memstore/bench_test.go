package memstore_test

import (
	"context"
	"runtime"
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
			if l.Rate > 100_000 {
				// Each key sees few events here: a lower rate keeps its
				// state alive (each event adds 864ms) for the whole run.
				l.Rate = 100_000
			}
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

// BenchmarkMemoryPerKey reports the heap bytes each key costs, for every
// algorithm, after 100k keys have each taken one event.
func BenchmarkMemoryPerKey(b *testing.B) {
	const nkeys = 100_000
	for _, a := range weir.Algorithms() {
		b.Run(string(a), func(b *testing.B) {
			l := weir.Limit{Algorithm: a, Rate: 100, Period: time.Hour}
			ctx := context.Background()
			var perKey float64
			for i := 0; i < b.N; i++ {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				s := memstore.New()
				for k := 0; k < nkeys; k++ {
					s.Take(ctx, "user:"+strconv.Itoa(k), l, 1)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perKey = float64(after.HeapAlloc-before.HeapAlloc) / nkeys
				runtime.KeepAlive(s)
			}
			b.ReportMetric(perKey, "bytes/key")
		})
	}
}
