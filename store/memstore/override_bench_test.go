package memstore_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/override"
	"github.com/weir-dev/weir/store/memstore"
)

// BenchmarkAllowOverrides is BenchmarkAllow's decision on one key with no
// override in the store ("none"), with an override on another key
// ("other": 1000 overrides on other keys, so the key pays a map lookup), and with one on the key itself.
func BenchmarkAllowOverrides(b *testing.B) {
	for _, a := range []weir.Algorithm{weir.FixedWindow, weir.GCRA, weir.TokenBucket} {
		for _, mode := range []string{"none", "other", "self"} {
			b.Run(string(a)+"/"+mode, func(b *testing.B) {
				s := memstore.New()
				l := benchLimit(a)
				ctx := context.Background()
				o := l
				o.Rate = l.Rate / 2
				switch mode {
				case "other":
					// 1000 other keys: every shard holds some, the key's too.
					for i := range 1000 {
						if err := s.SetOverride(ctx, override.Override{Key: "other" + strconv.Itoa(i), Limit: o}); err != nil {
							b.Fatal(err)
						}
					}
				case "self":
					if err := s.SetOverride(ctx, override.Override{Key: "key", Limit: o}); err != nil {
						b.Fatal(err)
					}
				}
				lim := weir.NewLimiter(s)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					lim.Allow(ctx, "key", l)
				}
			})
		}
	}
}
