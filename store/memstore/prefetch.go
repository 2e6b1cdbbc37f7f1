package memstore

import (
	"sync/atomic"
	"unsafe"
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

// prefetchSlot asks for the shard's line and for the line of the slot
// where a key of hash tag is looked for first.
func (s *Store) prefetchSlot(si uint64, tag uint32) {
	prefetch(uintptr(unsafe.Pointer(&s.shards[si])))
	h := &s.hints[si]
	if base := h.base.Load(); base != 0 {
		prefetch(base + (uintptr(tag)&h.mask.Load())*unsafe.Sizeof(slot{}))
	}
}
