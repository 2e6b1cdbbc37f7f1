package memstore

import (
	"sync/atomic"
	"unsafe"

	"github.com/weir-dev/weir/algorithm"
)

// A decision on a key not in cache waits for two lines from memory or
// from the other core's cache: the shard's, whose mutex it takes, and its
// key's slot. The slot's address depends only on the key's hash and the
// shard's table, so memstore asks the CPU for both lines at once, before
// taking the lock (a software prefetch: a hint, which neither faults nor
// waits, and which locked instructions and the clock read's fence do not
// order), and reads the clock under the lock while the slot is on its way.
//
// The table's address must be read without the shard's lock. It is kept
// apart from the shard, in the store's hints, written only when a table
// is resized: a line both cores keep in cache, unlike the shard's own,
// which every decision writes. A stale or torn hint only prefetches a
// useless line; nothing reads through it.

// hint is where a shard's table is, for prefetching.
type hint struct {
	base atomic.Uintptr // the address of slot 0; 0 while the table is empty
	mask atomic.Uintptr // len(slots)-1
}

// set records the shard's table, which the caller just replaced.
func (h *hint) set(slots []slot) {
	if h == nil {
		return
	}
	if len(slots) == 0 {
		h.base.Store(0)
		return
	}
	h.mask.Store(uintptr(len(slots) - 1))
	h.base.Store(uintptr(unsafe.Pointer(unsafe.SliceData(slots))))
}

// shardLines are the offsets in a shard of the lines a decision on a
// packed state uses: first the two it writes (the mutex's and the scratch
// counters': one line, twice, in the shard's layout), prefetched to be
// written, then the two it only reads (the table's header, the penalty
// box's end, the warm-up's start and the debt flag), prefetched to be
// read, so that both cores keep them. prefetch_*.s reads it.
var shardLines = func() [4]uintptr {
	scratch := unsafe.Offsetof(shardData{}.scratch)
	w := lineOffsets(
		unsafe.Offsetof(shardData{}.mu),
		scratch+unsafe.Offsetof(algorithm.State{}.Window),
		scratch+unsafe.Offsetof(algorithm.State{}.Frac),
	)
	r := lineOffsets(
		scratch+unsafe.Offsetof(algorithm.State{}.BlockedUntil),
		scratch+unsafe.Offsetof(algorithm.State{}.WarmStart),
		scratch+unsafe.Offsetof(algorithm.State{}.Debt),
		unsafe.Offsetof(shardData{}.slots),
	)
	return [4]uintptr{w[0], w[1], r[0], r[1]}
}()

const lineSize = 64

// lineOffsets returns the first two distinct cache lines of the offsets,
// which must be in increasing order; one line is returned twice.
func lineOffsets(offs ...uintptr) [2]uintptr {
	var lines [2]uintptr
	n := 0
	for _, o := range offs {
		l := o &^ (lineSize - 1)
		if n > 0 && lines[n-1] == l {
			continue
		}
		if n < len(lines) {
			lines[n] = l
			n++
		}
	}
	if n == 1 {
		lines[1] = lines[0]
	}
	return lines
}

// prefetchSlot asks for the shard's lines and for the line of the slot
// where a key of hash tag is looked for first (or the shard's first line
// again while its table is empty).
func (s *Store) prefetchSlot(si uint64, tag uint32) {
	sp := uintptr(unsafe.Pointer(&s.shards[si]))
	h := &s.hints[si]
	at := sp
	if base := h.base.Load(); base != 0 {
		at = base + (uintptr(tag)&h.mask.Load())*unsafe.Sizeof(slot{})
	}
	prefetchShard(sp, at)
}
