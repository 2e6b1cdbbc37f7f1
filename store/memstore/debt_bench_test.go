package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// BenchmarkDebt compares a debit and a settlement with a take, one
// goroutine on one key, per algorithm that has debt (make bench-debt).
// Settle is one store call: a debit of the excess over the estimate (here
// 3 over 5) or a refund of the rest (SettleRefund, 3 of 8), which
// SettleStamped dates by its take (a bounded refund).
func BenchmarkDebt(b *testing.B) {
	for _, a := range []weir.Algorithm{weir.GCRA, weir.TokenBucket, weir.LeakyBucket, weir.FixedWindow, weir.SlidingWindow} {
		l := benchLimit(a)
		ctx := context.Background()
		at := time.Now().UnixMicro()
		for _, op := range []struct {
			name string
			fn   func(*weir.Limiter) error
		}{
			{"Take", func(lim *weir.Limiter) error { _, err := lim.AllowN(ctx, "key", l, 1); return err }},
			{"Debit", func(lim *weir.Limiter) error { _, err := lim.Debit(ctx, "key", l, 1); return err }},
			{"Settle", func(lim *weir.Limiter) error { _, err := lim.Settle(ctx, "key", l, 5, 8); return err }},
			// A settlement below the estimate: a refund into the state as
			// it is, and one dated by its take (SettleStamped).
			{"SettleRefund", func(lim *weir.Limiter) error { _, err := lim.Settle(ctx, "key", l, 8, 5); return err }},
			{"SettleStamped", func(lim *weir.Limiter) error {
				_, err := lim.SettleStamped(ctx, "key", l, weir.Stamp{At: at, Estimate: 8, Remaining: 0}, 5)
				return err
			}},
		} {
			b.Run(string(a)+"/"+op.name, func(b *testing.B) {
				lim := weir.NewLimiter(memstore.New())
				b.ReportAllocs()
				for b.Loop() {
					if err := op.fn(lim); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkBatchStamped compares a batch of two requests (a policy's
// requests and tokens rules on one key) taken with TakeAll and with
// TakeAllStamped, which dates the takes for their settlements.
func BenchmarkBatchStamped(b *testing.B) {
	ctx := context.Background()
	reqs := []weir.Request{
		{Key: "k", Limit: weir.PerMinute(weir.GCRA, 1_000_000_000), N: 1},
		{Key: "k", Limit: weir.PerMinute(weir.TokenBucket, 1_000_000_000), N: 5},
	}
	res := make([]weir.Result, 2)
	s := memstore.New()
	for _, op := range []struct {
		name string
		fn   func() error
	}{
		{"TakeAll", func() error { return s.Do(ctx, reqs, res) }},
	} {
		b.Run(op.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := op.fn(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
