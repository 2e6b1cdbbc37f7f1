package bench

import (
	"context"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
	"golang.org/x/time/rate"
)

// The same limit for both: a token bucket refilling at a billion per
// second, so every decision admits and neither side measures rejections.

// BenchmarkSingleKey compares one goroutine allowing on one key.
func BenchmarkSingleKey(b *testing.B) {
	b.Run("x-time-rate", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1e9), 1e9)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			lim.Allow()
		}
	})
	for _, a := range []weir.Algorithm{weir.TokenBucket, weir.GCRA, weir.FixedWindow} {
		b.Run("weir-memstore-"+string(a), func(b *testing.B) {
			lim := weir.NewLimiter(memstore.New())
			l := weir.Limit{Algorithm: a, Rate: 1e9, Period: time.Second}
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				lim.Allow(ctx, "key", l)
			}
		})
	}
}

// TestSameDecisions keeps the comparison honest: both limiters admit the
// same burst and reject the next request.
func TestSameDecisions(t *testing.T) {
	x := rate.NewLimiter(rate.Every(time.Hour), 5)
	lim := weir.NewLimiter(memstore.New())
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 1, Period: time.Hour, Burst: 5}
	for i := 0; i < 6; i++ {
		r, err := lim.Allow(context.Background(), "k", l)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := r.Allowed, x.Allow(); got != want {
			t.Fatalf("request %d: weir %v, x/time/rate %v", i, got, want)
		}
	}
}
