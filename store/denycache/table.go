package denycache

import (
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
)

// entry is one cached denial: requests of cost at least n for its key under
// lim are rejected until exp. Times are nanoseconds on the table's
// monotonic clock, taken when the denied request was sent.
type entry struct {
	key       string
	h         uint64 // the key's hash
	lim       weir.Limit
	n         int64 // the denied cost: requests of this cost or more are answered
	maxCost   int64 // up to the most the limit admits at once (more is an error)
	exp       int64 // the denial lapses here (send time + RetryAfter)
	resetAt   int64 // send time + ResetAfter
	limit     int64 // Result.Limit
	remaining int64 // Result.Remaining at the denial
	blocked   time.Time

	// flight is the request that asks the store for this key under lim
	// once the entry has lapsed (the herd's leader), nil until one does;
	// the only field that changes after the entry is published.
	flight atomic.Pointer[flight]
}

// flight is one request for a lapsed entry's key and limit on its way to
// the store: others that the entry would have answered wait for it
// (Store.join) instead of going to the store at the same moment.
type flight struct {
	done    chan struct{} // closed once the leader's answer is kept, or not
	waiters atomic.Int32
	gen     int8 // 1: the first flight of the entry's lapse; 2: the second (the last)
}

// ended reports whether the leader's answer is in.
func (f *flight) ended() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// ways is how many entries a bucket holds: a key's entry can only sit in
// its own bucket, so a full bucket evicts one of its own.
const ways = 8

// bucket is one set of the set-associative table. Readers load its slots
// without a lock; writers hold their shard's lock.
type bucket [ways]atomic.Pointer[entry]

// shard is one lock of the table, with the epoch and counters of the
// buckets it guards, padded against false sharing with its neighbours.
type shard struct {
	mu    sync.Mutex
	epoch atomic.Uint64 // bumped by every invalidation that touches the shard
	hits  atomic.Int64
	miss  atomic.Int64
	herd  atomic.Int64 // of the hits, those that waited for a lapsed entry's leader
	_     [24]byte     // to 64 bytes
}

// table is the bounded set of cached denials: a fixed array of buckets,
// each of ways slots, so it never holds more than its size and never
// grows. An entry is immutable once published; replacing or dropping it
// swaps the slot's pointer.
type table struct {
	seed    maphash.Seed
	buckets []bucket
	shards  []shard
	smask   uint64
	base    time.Time        // the monotonic clock's origin
	clock   func() time.Time // nil: time.Since(base)

	evictions     atomic.Int64
	invalidations [nReasons]atomic.Int64
}

// Reasons for an invalidation, the label of the invalidations metric.
const (
	reasonReset  = iota // a Reset (or an unblock) of a key, here or on another instance
	reasonFlush         // every entry dropped: a rule change, here or elsewhere
	reasonBypass        // every entry dropped: the invalidation channel was lost or came back
	nReasons
)

// reasonNames are the invalidation reasons as Stats and the metric name them.
var reasonNames = [nReasons]string{"reset", "flush", "subscription"}

func newTable(size int, clock func() time.Time) *table {
	nb := max(1, size/ways)
	ns := 64
	for ns > 1 && ns > nb {
		ns /= 2
	}
	t := &table{seed: maphash.MakeSeed(), buckets: make([]bucket, nb), shards: make([]shard, ns), smask: uint64(ns - 1), clock: clock}
	if clock != nil {
		t.base = clock()
	} else {
		t.base = time.Now()
	}
	return t
}

// now reads the table's clock, in nanoseconds since base.
func (t *table) now() int64 {
	if t.clock != nil {
		return int64(t.clock().Sub(t.base))
	}
	return int64(time.Since(t.base))
}

// loc is where a key lives: its hash, bucket and shard.
type loc struct {
	h  uint64
	b  *bucket
	sh *shard
}

func (t *table) locate(key string) loc {
	h := maphash.String(t.seed, key)
	hi, _ := bits.Mul64(h, uint64(len(t.buckets)))
	return loc{h: h, b: &t.buckets[hi], sh: &t.shards[hi&t.smask]}
}

// find returns key's entry in its bucket, or nil.
func (lc *loc) find(key string) *entry {
	for i := range lc.b {
		if e := lc.b[i].Load(); e != nil && e.h == lc.h && e.key == key {
			return e
		}
	}
	return nil
}

// lookup answers a request of cost n (>= 1) for key under l at now from a
// live entry, or reports false. It counts hits; callers count misses.
func (t *table) lookup(lc *loc, key string, l weir.Limit, n, now int64) (weir.Result, bool) {
	e := lc.find(key)
	if e == nil || now >= e.exp || n < e.n || n > e.maxCost || e.lim != l {
		return weir.Result{}, false
	}
	lc.sh.hits.Add(1)
	r := weir.Result{
		Limit:        e.limit,
		Remaining:    e.remaining,
		RetryAfter:   time.Duration(e.exp - now),
		BlockedUntil: e.blocked,
	}
	if e.resetAt > now {
		r.ResetAfter = time.Duration(e.resetAt - now)
	}
	return r, true
}

// insert records res, the store's denial of a request of cost n sent at
// sent, unless the shard was invalidated since epoch (read before the
// request was sent), in which case the denial may predate a reset.
func (t *table) insert(lc *loc, key string, l weir.Limit, n, maxCost, sent int64, epoch uint64, res *weir.Result) {
	e := &entry{
		key:       key,
		h:         lc.h,
		lim:       l,
		n:         n,
		maxCost:   maxCost,
		exp:       sent + int64(res.RetryAfter),
		resetAt:   sent + int64(res.ResetAfter),
		limit:     res.Limit,
		remaining: res.Remaining,
		blocked:   res.BlockedUntil,
	}
	now := t.now()
	if e.exp <= now {
		return
	}
	lc.sh.mu.Lock()
	defer lc.sh.mu.Unlock()
	if lc.sh.epoch.Load() != epoch {
		return
	}
	// The key's own slot, else a free or lapsed one, else the one that
	// lapses first.
	free, soonest, soonestExp := -1, 0, int64(math.MaxInt64)
	for i := range lc.b {
		old := lc.b[i].Load()
		switch {
		case old == nil || old.exp <= now:
			if free < 0 {
				free = i
			}
		case old.h == lc.h && old.key == key:
			// Both are true; keep the one that answers more requests: the
			// smaller cost, else the later end.
			if old.lim == l && (old.n < n || old.n == n && old.exp >= e.exp) {
				return
			}
			lc.b[i].Store(e)
			return
		case old.exp < soonestExp:
			soonest, soonestExp = i, old.exp
		}
	}
	if free >= 0 {
		lc.b[free].Store(e)
		return
	}
	t.evictions.Add(1)
	lc.b[soonest].Store(e)
}

// invalidateKey drops key's entry, whatever its limit, and makes every
// request in flight on its shard leave no entry.
func (t *table) invalidateKey(key string) {
	lc := t.locate(key)
	lc.sh.mu.Lock()
	lc.sh.epoch.Add(1)
	for i := range lc.b {
		if e := lc.b[i].Load(); e != nil && e.h == lc.h && e.key == key {
			lc.b[i].Store(nil)
		}
	}
	lc.sh.mu.Unlock()
	t.invalidations[reasonReset].Add(1)
}

// flush drops every entry and makes every request in flight leave none.
func (t *table) flush(reason int) {
	for i := range t.shards {
		t.shards[i].mu.Lock()
		t.shards[i].epoch.Add(1)
	}
	for i := range t.buckets {
		for j := range t.buckets[i] {
			t.buckets[i][j].Store(nil)
		}
	}
	for i := range t.shards {
		t.shards[i].mu.Unlock()
	}
	t.invalidations[reason].Add(1)
}

// len counts the entries held, lapsed ones included.
func (t *table) len() int {
	n := 0
	for i := range t.buckets {
		for j := range t.buckets[i] {
			if t.buckets[i][j].Load() != nil {
				n++
			}
		}
	}
	return n
}
