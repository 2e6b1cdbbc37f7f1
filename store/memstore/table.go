package memstore

import (
	"sync"
	"unsafe"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/events"
)

// Each shard holds its keys in an open-addressed table: a slice of slots,
// probed linearly from the home index of the key's hash, at most 7/8 full
// (a table that fits the caches and the TLB better is worth the longer
// probes, which stay within adjacent cache lines).
// A slot holds one key's state under one algorithm inline, so a decision on
// a held key reads one 64-byte slot (and the key's bytes, which hashing
// read already) instead of a map group, the key, an entry and its state.
// A key used under several algorithms has a slot per algorithm, all in the
// run of full slots that starts at their common home index. Deletion
// shifts the run back (Knuth's algorithm R), so there are no tombstones.

// slot is one key's state under one algorithm: 64 bytes on 64-bit
// platforms.
type slot struct {
	key  unsafe.Pointer // the key's bytes (unsafe.StringData)
	klen uint32         // the key's length
	tag  uint32         // the high half of the key's hash; its low bits are the home index
	c    *compiled      // the limit this state was last used with; nil: the slot is empty
	// expires is when the state no longer matters, µs.
	expires int64
	v       [3]int64         // the state, packed under c.lay (state.go), when x is nil
	x       *algorithm.State // the state, when it does not pack
}

func (sl *slot) keyString() string { return unsafe.String((*byte)(sl.key), sl.klen) }

// is reports whether sl holds key, whose hash's high half is tag.
func (sl *slot) is(key string, tag uint32) bool {
	if sl.tag != tag || int(sl.klen) != len(key) {
		return false
	}
	// The caller's string is often the very one the slot holds.
	return sl.key == unsafe.Pointer(unsafe.StringData(key)) || sl.keyString() == key
}

// maxKeyLen is the longest key a slot holds.
const maxKeyLen = 1<<32 - 1

type shardData struct {
	// A random key's shard was most often last used by the other core, so
	// each line a decision writes then comes from that core's cache.
	// A decision on a packed state writes mu and scratch's counters only,
	// which share the first line; the rest of the shard it only reads
	// (slots) or changes when keys come and go (see prefetch.go).
	mu sync.Mutex
	// scratch is the State a decision runs on when the key's state is
	// packed in its slot. Only its packed fields are ever non-zero
	// between decisions: what does not pack moves out (spill).
	scratch algorithm.State
	slots   []slot // a power of two long, or empty
	hint    *hint  // the store's record of where slots is (prefetch.go)
	used    int    // full slots
	keys    int    // distinct keys held
	// limit is the most keys the shard may hold; the shards' limits add
	// up to the store's MaxKeys.
	limit int
	hand  int // where the next sweep or eviction sample starts
	// ev holds the event markers of the shard's keys under rules with
	// events (events.go); nil until one fires.
	ev map[string]events.Marker
}

// shard is padded to a whole number of 64-byte lines, so that neighbours
// share no line once the array is aligned.
type shard struct {
	shardData
	_ [(64 - unsafe.Sizeof(shardData{})%64) % 64]byte
}

func (sh *shard) mask() int { return len(sh.slots) - 1 }

// findLimit returns the index of key's slot last used with l, or -1.
func (sh *shard) findLimit(key string, tag uint32, l *weir.Limit) int {
	if len(sh.slots) == 0 {
		return -1
	}
	m := sh.mask()
	for i := int(tag) & m; ; i = (i + 1) & m {
		sl := &sh.slots[i]
		if sl.c == nil {
			return -1
		}
		if sl.is(key, tag) && sameLimit(&sl.c.limit, l) {
			return i
		}
	}
}

// findKind returns the index of key's slot under algorithm k, or -1.
func (sh *shard) findKind(key string, tag uint32, k algorithm.Kind) int {
	if len(sh.slots) == 0 {
		return -1
	}
	m := sh.mask()
	for i := int(tag) & m; ; i = (i + 1) & m {
		sl := &sh.slots[i]
		if sl.c == nil {
			return -1
		}
		if sl.is(key, tag) && sl.c.params.Kind == k {
			return i
		}
	}
}

// findKey returns the index of one of key's slots, or -1.
func (sh *shard) findKey(key string, tag uint32) int {
	if len(sh.slots) == 0 {
		return -1
	}
	m := sh.mask()
	for i := int(tag) & m; ; i = (i + 1) & m {
		sl := &sh.slots[i]
		if sl.c == nil {
			return -1
		}
		if sl.is(key, tag) {
			return i
		}
	}
}

// insert adds sl, whose key holds no slot under its algorithm yet. It does
// not check the shard's limit: the caller made room.
func (sh *shard) insert(sl slot) {
	if (sh.used+1)*8 > len(sh.slots)*7 {
		sh.grow()
	}
	m := sh.mask()
	newKey := true
	i := int(sl.tag) & m
	for ; sh.slots[i].c != nil; i = (i + 1) & m {
		if sh.slots[i].tag == sl.tag && sh.slots[i].klen == sl.klen && sh.slots[i].keyString() == sl.keyString() {
			newKey = false
		}
	}
	sh.slots[i] = sl
	sh.used++
	if newKey {
		sh.keys++
	}
}

// grow doubles the table (its first size is 8 slots).
func (sh *shard) grow() { sh.resize(max(8, 2*len(sh.slots))) }

// shrinkIfSparse halves a table less than 1/8 full, so that a shard whose
// keys went (swept, evicted, reset) does not keep a table that samples
// would have to scan through.
func (sh *shard) shrinkIfSparse() {
	if len(sh.slots) > 8 && sh.used*8 < len(sh.slots) {
		sh.resize(len(sh.slots) / 2)
	}
}

// resize moves every slot into a new table n slots long.
func (sh *shard) resize(n int) {
	old := sh.slots
	sh.slots = make([]slot, n)
	sh.hint.set(sh.slots)
	m := sh.mask()
	for j := range old {
		if old[j].c == nil {
			continue
		}
		i := int(old[j].tag) & m
		for sh.slots[i].c != nil {
			i = (i + 1) & m
		}
		sh.slots[i] = old[j]
	}
}

// deleteAt empties slot i and moves back the slots after it that would
// otherwise no longer be found from their home index. It does not count
// keys: see removeKind and removeKey.
func (sh *shard) deleteAt(i int) {
	m := sh.mask()
	sh.slots[i] = slot{}
	sh.used--
	for j := (i + 1) & m; sh.slots[j].c != nil; j = (j + 1) & m {
		home := int(sh.slots[j].tag) & m
		// The slot at j stays if its home lies cyclically in (i, j].
		if i <= j {
			if i < home && home <= j {
				continue
			}
		} else if i < home || home <= j {
			continue
		}
		sh.slots[i] = sh.slots[j]
		sh.slots[j] = slot{}
		i = j
	}
}

// removeKind deletes key's state under algorithm k, keeping any other
// algorithm's.
func (sh *shard) removeKind(key string, tag uint32, k algorithm.Kind) {
	i := sh.findKind(key, tag, k)
	if i < 0 {
		return
	}
	sh.deleteAt(i)
	if sh.findKey(key, tag) < 0 {
		sh.keys--
	}
	sh.shrinkIfSparse()
}

// removeKey deletes key under every algorithm, if held.
func (sh *shard) removeKey(key string, tag uint32) {
	i := sh.findKey(key, tag)
	if i < 0 {
		return
	}
	for ; i >= 0; i = sh.findKey(key, tag) {
		sh.deleteAt(i)
	}
	sh.keys--
	sh.shrinkIfSparse()
}

// keyExpired reports whether every algorithm's state under key has
// expired at now.
func (sh *shard) keyExpired(key string, tag uint32, now int64) bool {
	m := sh.mask()
	for i := int(tag) & m; sh.slots[i].c != nil; i = (i + 1) & m {
		if sh.slots[i].is(key, tag) && sh.slots[i].expires > now {
			return false
		}
	}
	return true
}

// keyEnforcing reports whether any algorithm's state under key enforces
// at now: it would refuse a request of cost 1 (a penalty box in force, a
// counter at or over its limit, a debt, leases at capacity). Eviction
// keeps such keys (memstore.go, evict). It peeks (algorithm.Check) at a
// copy of a packed state and at a spilled one, which, as any decision
// does, only drops what has lapsed (an ended box, expired log entries).
func (sh *shard) keyEnforcing(key string, tag uint32, now int64) bool {
	m := sh.mask()
	for i := int(tag) & m; sh.slots[i].c != nil; i = (i + 1) & m {
		sl := &sh.slots[i]
		if !sl.is(key, tag) || sl.expires <= now {
			continue
		}
		st := sl.x
		var packed algorithm.State
		if st == nil {
			unpack(sl.c.lay, &sl.v, &packed)
			st = &packed
		}
		if !algorithm.Check(&sl.c.params, st, now, 0, algorithm.Exact).Allowed {
			return true
		}
	}
	return false
}

// next returns the index of the next full slot from the hand, moving the
// hand past it. The shard must hold at least one slot.
func (sh *shard) next() int {
	m := sh.mask()
	i := sh.hand & m
	for sh.slots[i].c == nil {
		i = (i + 1) & m
	}
	sh.hand = i + 1
	return i
}
