package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/storetest"
)

// checkHints fails unless every shard's hint gives its table's address
// and mask, so that a decision prefetches the line its key is looked for
// in first.
func checkHints(t *testing.T, s *Store, when string) {
	t.Helper()
	for i := range s.shards {
		sh := &s.shards[i]
		h := &s.hints[i]
		if sh.hint != h {
			t.Fatalf("%s: shard %d records its table in the wrong hint", when, i)
		}
		if len(sh.slots) == 0 {
			if h.base.Load() != 0 {
				t.Fatalf("%s: shard %d has no table but a hint at %#x", when, i, h.base.Load())
			}
			continue
		}
		if base, mask := h.base.Load(), h.mask.Load(); base != uintptr(unsafe.Pointer(&sh.slots[0])) || mask != uintptr(len(sh.slots)-1) {
			t.Fatalf("%s: shard %d's hint says %#x mask %d, its table is at %p, %d slots", when, i, base, mask, &sh.slots[0], len(sh.slots))
		}
	}
}

// TestHintFollowsTable: the hints follow each table as it grows and
// shrinks.
func TestHintFollowsTable(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	s := New(WithClock(clock.Now), WithShards(4))
	checkHints(t, s, "new")
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Hour}
	for i := range 5000 {
		s.Take(ctx, fmt.Sprint("k", i), l, 1)
		if i%97 == 0 {
			checkHints(t, s, fmt.Sprintf("after %d keys", i+1))
		}
	}
	checkHints(t, s, "grown")
	for i := range 4990 {
		weir.NewLimiter(s).Reset(ctx, fmt.Sprint("k", i), l)
	}
	checkHints(t, s, "shrunk")
}

// TestPrefetchAnyAddress: prefetch is a hint that never faults, so a stale
// hint (a table since freed, or a base and a mask from two tables) is
// harmless.
func TestPrefetchAnyAddress(t *testing.T) {
	var x [64]byte
	for _, a := range []uintptr{0, 8, 1 << 20, ^uintptr(0), ^uintptr(0) - 4095, uintptr(unsafe.Pointer(&x))} {
		prefetchShard(a, a)
		prefetchShard(uintptr(unsafe.Pointer(&x)), a)
	}
}

// TestShardLines: the lines prefetched are the shard's and include those
// of the mutex, the table's header and the scratch fields a decision on a
// packed state uses, the ones it writes first.
func TestShardLines(t *testing.T) {
	var sh shard
	base := uintptr(unsafe.Pointer(&sh))
	has := func(p unsafe.Pointer) bool {
		return hasIn(shardLines[:], base, p)
	}
	written := func(p unsafe.Pointer) bool {
		return hasIn(shardLines[:2], base, p)
	}
	for _, o := range shardLines {
		if o >= unsafe.Sizeof(sh) || o%lineSize != 0 {
			t.Fatalf("shardLines %v: not lines of a %d-byte shard", shardLines, unsafe.Sizeof(sh))
		}
	}
	st := &sh.scratch
	for name, p := range map[string]unsafe.Pointer{
		"mu": unsafe.Pointer(&sh.mu), "Window": unsafe.Pointer(&st.Window), "Level": unsafe.Pointer(&st.Level),
		"TAT": unsafe.Pointer(&st.TAT), "Frac": unsafe.Pointer(&st.Frac), "BlockedUntil": unsafe.Pointer(&st.BlockedUntil),
		"WarmStart": unsafe.Pointer(&st.WarmStart), "Debt": unsafe.Pointer(&st.Debt), "slots": unsafe.Pointer(&sh.slots),
	} {
		if !has(p) {
			t.Errorf("the line of %s (offset %d) is not prefetched: %v", name, uintptr(p)-base, shardLines)
		}
	}
	// The first two are prefetched to be written: they must hold what a
	// decision writes.
	for name, p := range map[string]unsafe.Pointer{
		"mu": unsafe.Pointer(&sh.mu), "Window": unsafe.Pointer(&st.Window), "Count": unsafe.Pointer(&st.Count),
		"Prev": unsafe.Pointer(&st.Prev), "Level": unsafe.Pointer(&st.Level), "TS": unsafe.Pointer(&st.TS),
		"TAT": unsafe.Pointer(&st.TAT), "Frac": unsafe.Pointer(&st.Frac),
	} {
		if !written(p) {
			t.Errorf("the line of %s (offset %d) is not among the lines prefetched to be written: %v", name, uintptr(p)-base, shardLines[:2])
		}
	}
}

func hasIn(lines []uintptr, base uintptr, p unsafe.Pointer) bool {
	l := (uintptr(p) - base) &^ (lineSize - 1)
	for _, o := range lines {
		if o == l {
			return true
		}
	}
	return false
}
