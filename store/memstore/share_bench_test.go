package memstore

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
)

// BenchmarkShardSharing measures what the two cores pass each other: two
// goroutines over 100k keys, each on all of them (random: what
// BenchmarkAllowParallel does), on the keys of its own half of the shards
// (no line of a shard or a slot goes from one core to the other), or on
// its own half of the keys with the shards shared (only the shards' lines
// go between the cores). ns/op is wall time per decision.
func BenchmarkShardSharing(b *testing.B) {
	const nkeys = 100_000
	s := New()
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 100_000, Period: 24 * time.Hour}
	ctx := context.Background()
	for _, k := range keys {
		s.Take(ctx, k, l, 1)
	}
	var byShard, byKey [2][]string
	for i, k := range keys {
		si, _ := s.hashIndex(k)
		byShard[si&1] = append(byShard[si&1], k)
		byKey[i&1] = append(byKey[i&1], k)
	}
	run := func(b *testing.B, sets [2][]string) {
		var wg sync.WaitGroup
		b.ReportAllocs()
		b.ResetTimer()
		for g := range 2 {
			wg.Add(1)
			go func(ks []string, i uint64) {
				defer wg.Done()
				for range b.N / 2 {
					i = i*6364136223846793005 + 1442695040888963407
					s.Take(ctx, ks[(i>>33)%uint64(len(ks))], l, 1)
				}
			}(sets[g], uint64(g)*7919+1)
		}
		wg.Wait()
	}
	b.Run("random", func(b *testing.B) { run(b, [2][]string{keys, keys}) })
	b.Run("own_shards", func(b *testing.B) { run(b, byShard) })
	b.Run("own_keys", func(b *testing.B) { run(b, byKey) })
}
