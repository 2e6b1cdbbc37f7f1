// Package memstore is weir's in-memory Store: one process, zero set-up.
//
// Keys are spread over shards, each with its own mutex, so goroutines
// working on different keys rarely contend. The number of keys is bounded:
// each key's state carries the instant after which it no longer matters
// (its TTL), every insertion sweeps a couple of keys whose TTL has passed,
// and a full shard first drops expired keys and otherwise the key whose
// state expires soonest among a sample, as Redis's volatile-ttl policy does.
// Evicting live state forgets a limit early, so size MaxKeys for the keys
// you expect within the longest period.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// DefaultMaxKeys is the default bound on the number of keys held.
const DefaultMaxKeys = 1 << 20

// Store is the in-memory store. The zero value is not usable; call New.
type Store struct {
	shards  []shard
	mask    uint64
	seed    maphash.Seed
	now     func() time.Time // an injected clock; nil means clock
	clock   monoClock
	maxKeys int
	nshards int

	// Compiled limits are shared by every key under the same limit.
	limitsMu sync.Mutex
	limits   map[weir.Limit]*compiled

	resv reservations // weir serve's open reservations (reservations.go)

	// last is the limit compiled most recently: a new key under the
	// same limit as the previous one finds it without the lock.
	last atomic.Pointer[compiled]
}

// maxCompiled bounds the shared-limit cache; beyond it (a program that
// makes limits per key) each entry compiles its own.
const maxCompiled = 4096

type compiled struct {
	limit  weir.Limit
	params algorithm.Params
}

// compile returns l compiled, from the cache when possible.
func (s *Store) compile(l weir.Limit) (*compiled, error) {
	if c := s.last.Load(); c != nil && sameLimit(&c.limit, &l) {
		return c, nil
	}
	s.limitsMu.Lock()
	defer s.limitsMu.Unlock()
	if c := s.limits[l]; c != nil {
		s.last.Store(c)
		return c, nil
	}
	p, err := l.Compile()
	if err != nil {
		return nil, err
	}
	c := &compiled{l, p}
	if len(s.limits) < maxCompiled {
		s.limits[l] = c
		s.last.Store(c)
	}
	return c, nil
}

type shard struct {
	mu sync.Mutex
	// m is keyed by the plain key, so lookups take Go's fast string-key
	// path; the rare key used under several algorithms chains its entries.
	m map[string]*entry
	// limit is the most keys the shard may hold; the shards' limits add
	// up to the store's MaxKeys.
	limit int
	// lastHash and lastHead remember the key decided last (its hash and
	// the head of its chain), so that a key decided again finds its entry
	// without the map's own hashing and probe. Every change to the map
	// forgets it (forget).
	lastHash uint64
	lastKey  string
	lastHead *entry
	// The padding makes a shard 64 bytes on 64-bit platforms, so that
	// consecutive shards' mutexes lie 64 bytes apart and never share a
	// 64-byte cache line. It does not align a shard to a line (the array
	// may start 8 bytes in, after the allocator's header), so a shard can
	// straddle two lines, holding its neighbour's padding; on 32-bit
	// platforms a shard is 56 bytes and neighbours can share a line.
	_ [8]byte
}

// forget drops the remembered last key: the map is about to change.
func (sh *shard) forget() { sh.lastHead, sh.lastKey = nil, "" }

type stateKey struct {
	key  string
	kind algorithm.Kind
}

type entry struct {
	kind algorithm.Kind
	next *entry    // the same key under another algorithm
	c    *compiled // the limit this state was last used with
	// expires is written by every decision: it sits beside the fields
	// read first, so that a decision on a key not in cache touches fewer
	// cache lines.
	expires int64 // µs: the state no longer matters from here on
	state   algorithm.State
}

// get returns the entry for sk, or nil.
func (sh *shard) get(sk stateKey) *entry {
	e := sh.m[sk.key]
	for e != nil && e.kind != sk.kind {
		e = e.next
	}
	return e
}

// put inserts e under sk, which must not be present.
func (sh *shard) put(sk stateKey, e *entry) {
	sh.forget()
	e.kind = sk.kind
	e.next = sh.m[sk.key]
	sh.m[sk.key] = e
}

// remove deletes sk's entry, keeping any other algorithm's.
func (sh *shard) remove(sk stateKey) {
	sh.forget()
	head := sh.m[sk.key]
	if head == nil {
		return
	}
	if head.kind == sk.kind {
		if head.next == nil {
			delete(sh.m, sk.key)
		} else {
			sh.m[sk.key] = head.next
		}
		return
	}
	for p := head; p.next != nil; p = p.next {
		if p.next.kind == sk.kind {
			p.next = p.next.next
			return
		}
	}
}

// Option configures a Store.
type Option func(*Store)

// WithClock makes the store read time from now instead of time.Now. Tests
// use it to step time exactly.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithMaxKeys bounds the number of keys held (DefaultMaxKeys by default):
// the store never holds more than n keys, whatever n is (at least 1).
func WithMaxKeys(n int) Option { return func(s *Store) { s.maxKeys = n } }

// WithShards sets the number of shards, rounded up to a power of two
// (default 256). A store bounded to fewer than 16 keys per shard uses
// fewer shards, so that each has room for at least 16 (or the whole store
// is one shard).
func WithShards(n int) Option { return func(s *Store) { s.nshards = n } }

// New returns an empty Store.
func New(opts ...Option) *Store {
	s := &Store{maxKeys: DefaultMaxKeys, nshards: 256, seed: maphash.MakeSeed(), limits: map[weir.Limit]*compiled{}}
	for _, o := range opts {
		o(s)
	}
	s.maxKeys = max(s.maxKeys, 1)
	n := 1
	for n < s.nshards {
		n <<= 1
	}
	// Each shard evicts on its own, so a shard with room for only a key or
	// two would evict long before the store is full.
	for n > 1 && s.maxKeys/n < minShardKeys {
		n >>= 1
	}
	s.shards = make([]shard, n)
	s.mask = uint64(n - 1)
	// The shards share MaxKeys exactly: the first MaxKeys%n get one more.
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
		s.shards[i].limit = s.maxKeys / n
		if i < s.maxKeys%n {
			s.shards[i].limit++
		}
	}
	s.clock.rebase()
	return s
}

// minShardKeys is the fewest keys a shard is given room for, unless the
// whole store has fewer.
const minShardKeys = 16

// micros returns the current time in µs since the Unix epoch.
func (s *Store) micros() int64 {
	if s.now != nil {
		return s.now().UnixMicro()
	}
	return s.clock.micros()
}

// monoClock reads the wall clock as a base plus monotonic time elapsed
// since: one clock read per decision instead of time.Now's two. It takes a
// fresh base every minute, so NTP's adjustments reach it soon.
type monoClock struct {
	base atomic.Pointer[clockBase]
}

type clockBase struct {
	t    time.Time // carries a monotonic reading
	wall int64     // t in µs since the epoch
}

const rebaseEvery = time.Minute

func (c *monoClock) rebase() {
	t := time.Now()
	c.base.Store(&clockBase{t, t.UnixMicro()})
}

func (c *monoClock) micros() int64 {
	b := c.base.Load()
	el := time.Since(b.t) // monotonic only: one vDSO call
	if el >= rebaseEvery || el < 0 {
		c.rebase()
		b = c.base.Load()
		el = time.Since(b.t)
	}
	return b.wall + el.Microseconds()
}

func (s *Store) shardOf(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)&s.mask]
}

func (s *Store) shardIndex(key string) int { return int(maphash.String(s.seed, key) & s.mask) }

// entryFor returns key's entry, creating (but not inserting) one if absent,
// with its limit compiled as l. The shard must be locked.
func (s *Store) entryFor(sh *shard, sk stateKey, l weir.Limit) (e *entry, fresh bool, err error) {
	return s.entryOf(sh.get(sk), l)
}

// entryOf returns e, a key's entry under l's algorithm (nil if absent, in
// which case it creates one), with its limit compiled as l.
func (s *Store) entryOf(e *entry, l weir.Limit) (_ *entry, fresh bool, err error) {
	if e != nil && sameLimit(&e.c.limit, &l) {
		return e, false, nil
	}
	c, err := s.compile(l)
	if err != nil {
		return nil, false, err
	}
	if e == nil {
		e, fresh = &entry{}, true
	} else if e.c.limit.Warmup != l.Warmup {
		// A warm-up counts in other units and, in Redis, under another
		// key: switching it on or off starts the key afresh.
		e.state = algorithm.State{}
	}
	e.c = c
	return e, fresh, nil
}

// sameLimit is l == m, ordered so the common case (an unchanged limit)
// costs a few integer compares.
func sameLimit(l, m *weir.Limit) bool {
	return l.Rate == m.Rate && l.Period == m.Period && l.Burst == m.Burst && l.Block == m.Block &&
		l.MaxDelay == m.MaxDelay && l.DelayAfter == m.DelayAfter && l.Buckets == m.Buckets && l.Algorithm == m.Algorithm &&
		sameExtras(l, m)
}

// sameExtras compares the settings of escalating penalties, calendar
// quotas and warm-up, which most limits leave zero.
func sameExtras(l, m *weir.Limit) bool {
	return l.Escalate == m.Escalate && l.ForgetAfter == m.ForgetAfter &&
		l.Calendar == m.Calendar && l.Timezone == m.Timezone && l.ResetAt == m.ResetAt && l.Warmup == m.Warmup
}

func kindOf(l weir.Limit) (algorithm.Kind, error) {
	k, ok := l.Algorithm.Kind()
	if !ok {
		return 0, l.Validate()
	}
	return k, nil
}

// Take implements weir.Store.
func (s *Store) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	return s.take(key, l, n, algorithm.Exact, "")
}

func (s *Store) take(key string, l weir.Limit, n int64, mode algorithm.Mode, lease string) (weir.Result, error) {
	h := maphash.String(s.seed, key)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// The common case first: the key holds a state last used with this
	// very limit (so of its algorithm), found without parsing the
	// algorithm's name or looking at the compiled-limit cache. The key
	// decided last in this shard is found without a map lookup.
	var head *entry
	if sh.lastHead != nil && sh.lastHash == h && sh.lastKey == key {
		head = sh.lastHead
	} else {
		head = sh.m[key]
		sh.lastHash, sh.lastKey, sh.lastHead = h, key, head
	}
	e := head
	for e != nil && !sameLimit(&e.c.limit, &l) {
		e = e.next
	}
	fresh := false
	var sk stateKey
	if e == nil {
		k, err := kindOf(l)
		if err != nil {
			return weir.Result{}, err
		}
		sk = stateKey{key, k}
		for e = head; e != nil && e.kind != k; e = e.next {
		}
		if e, fresh, err = s.entryOf(e, l); err != nil {
			return weir.Result{}, err
		}
	}
	maxCost := e.c.params.MaxCost()
	if mode >= algorithm.Debit {
		// A debit or refund may pass the limit (debt.go).
		if err := weir.CheckDebt(key, n, &e.c.params, mode); err != nil {
			return weir.Result{}, err
		}
		maxCost = algorithm.MaxDebt
	}
	if mode == algorithm.AtMost {
		n = min(n, maxCost) // a partial grant may ask for more than fits
	}
	if n < 0 || n > maxCost {
		return weir.Result{}, weir.CheckCost(key, n, maxCost)
	}
	now := s.micros()
	d := algorithm.Take(&e.c.params, &e.state, now, n, mode)
	if d.Granted > 0 && lease != "" {
		algorithm.SetLeaseID(&e.state, lease)
	}
	if fresh {
		s.save(sh, sk, e, fresh, now, d.TTL, false)
	} else {
		e.expires = now + d.TTL // what save does for a held entry
	}
	return weir.ResultOf(d), nil
}

// save records e's new expiry and inserts it if it is new and matters,
// first making room unless the caller already did.
func (s *Store) save(sh *shard, sk stateKey, e *entry, fresh bool, now, ttl int64, swept bool) {
	e.expires = now + ttl
	if !fresh {
		return
	}
	if ttl <= 0 {
		return // an untouched key: nothing worth keeping
	}
	if !swept {
		s.makeRoom(sh, now, 1, nil)
	}
	if sh.m[sk.key] == nil && len(sh.m) >= sh.limit {
		// A batch with more new keys than its shard holds: the state is
		// forgotten at once, as if evicted, so the bound always holds.
		return
	}
	sh.put(sk, e)
}

// makeRoom sweeps a few expired keys and then, while the shard has no
// room for need more keys, evicts: never a key for which keep (if not nil)
// is true. The shard must be locked.
func (s *Store) makeRoom(sh *shard, now int64, need int, keep func(string) bool) {
	// Like Redis's active expiry: sample a few keys, drop the expired ones,
	// and sample again while at least half of a sample had expired.
	const sweep, rounds = 4, 8
	for r := 0; r < rounds; r++ {
		seen, expired := 0, 0
		for k, e := range sh.m { // map iteration starts at a random place
			if chainExpired(e, now) && (keep == nil || !keep(k)) {
				sh.forget()
				delete(sh.m, k)
				expired++
			}
			if seen++; seen >= sweep {
				break
			}
		}
		if expired*2 < sweep {
			break
		}
	}
	for len(sh.m)+need > sh.limit {
		if !s.evict(sh, now, keep) {
			return
		}
	}
}

// evict drops the expired keys of a sample or, if none had expired, the
// one whose state expires soonest, and reports whether it dropped any.
// The shard must be locked.
func (s *Store) evict(sh *shard, now int64, keep func(string) bool) bool {
	const sample = 16
	var victim string
	soonest := int64(1<<63 - 1)
	i, dropped := 0, false
	for k, e := range sh.m {
		switch {
		case keep != nil && keep(k):
		case chainExpired(e, now):
			sh.forget()
			delete(sh.m, k)
			dropped = true
		case e.expires < soonest:
			victim, soonest = k, e.expires
		}
		if i++; i >= sample {
			break
		}
	}
	if !dropped && soonest != 1<<63-1 {
		sh.forget()
		delete(sh.m, victim)
		dropped = true
	}
	if !dropped && keep != nil {
		// The sample held only protected keys: look at them all.
		for k, e := range sh.m {
			if !keep(k) && e.expires < soonest {
				victim, soonest = k, e.expires
			}
		}
		if soonest != 1<<63-1 {
			sh.forget()
			delete(sh.m, victim)
			dropped = true
		}
	}
	return dropped
}

// chainExpired reports whether every algorithm's state under one key has expired.
func chainExpired(e *entry, now int64) bool {
	for ; e != nil; e = e.next {
		if e.expires > now {
			return false
		}
	}
	return true
}

// TakeAll implements weir.MultiStore: every request is decided under the
// locks of all their shards, taken in index order so batches cannot
// deadlock. Keys in one batch must be distinct.
func (s *Store) TakeAll(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if len(results) < len(reqs) {
		return fmt.Errorf("memstore: %d results for %d requests", len(results), len(reqs))
	}
	if len(reqs) == 1 {
		r := reqs[0]
		res, err := s.take(r.Key, r.Limit, r.N, r.AlgorithmMode(), r.Lease)
		results[0] = res
		return err
	}
	for i := range reqs {
		if reqs[i].Mode != weir.ModeTake {
			return fmt.Errorf("%w: a %s decides one request at a time, not a batch of %d", weir.ErrUnsupported, reqs[i].Mode, len(reqs))
		}
	}
	// Batches are small (one request per matched rule): keep them on the stack.
	var itemsBuf [8]batchItem
	var idxBuf [8]int
	items := itemsBuf[:0]
	if len(reqs) > len(itemsBuf) {
		items = make([]batchItem, 0, len(reqs))
	}
	items = items[:len(reqs)]
	idx, err := s.planBatch(reqs, items, idxBuf[:0])
	if err != nil {
		return err
	}
	s.lockShards(idx)
	defer s.unlockShards(idx)
	now := s.micros()
	s.makeRoomForBatch(reqs, items, idx, now)
	if err := s.resolveBatch(reqs, items); err != nil {
		return err
	}
	s.decideBatch(reqs, items, results, now)
	return nil
}

// batchItem is one request of a TakeAll batch being decided.
type batchItem struct {
	sk    stateKey
	sh    *shard
	e     *entry
	fresh bool
	mode  algorithm.Mode
	n     int64
}

// planBatch checks each request's algorithm, refuses a key that appears
// twice under one algorithm, and fills each item's state key, shard and
// mode. It returns the batch's shard indexes, sorted and distinct, appended
// to idx.
func (s *Store) planBatch(reqs []weir.Request, items []batchItem, idx []int) ([]int, error) {
	for i, r := range reqs {
		k, err := kindOf(r.Limit)
		if err != nil {
			return nil, err
		}
		for j := 0; j < i; j++ {
			if reqs[j].Key == r.Key && items[j].sk.kind == k {
				return nil, fmt.Errorf("memstore: key %q appears twice in one batch", r.Key)
			}
		}
		items[i].sk = stateKey{r.Key, k}
		si := s.shardIndex(r.Key)
		items[i].sh = &s.shards[si]
		if r.AtMost {
			items[i].mode = algorithm.AtMost
		}
		idx = append(idx, si)
	}
	slices.Sort(idx)
	return slices.Compact(idx), nil
}

// lockShards locks the shards idx names, in its (ascending) order.
func (s *Store) lockShards(idx []int) {
	for _, si := range idx {
		s.shards[si].mu.Lock()
	}
}

// unlockShards unlocks the shards lockShards locked.
func (s *Store) unlockShards(idx []int) {
	for _, si := range idx {
		s.shards[si].mu.Unlock()
	}
}

// makeRoomForBatch sweeps before any entry of the batch is resolved: a
// sweep run while saving one member could otherwise drop another member's
// (expired) entry after it was looked up, losing that member's new state.
// Each shard needs room for the batch's keys it does not hold yet, and no
// sweep or eviction may drop a key of the batch, which would make it new
// after its room was counted.
func (s *Store) makeRoomForBatch(reqs []weir.Request, items []batchItem, idx []int, now int64) {
	inBatch := func(k string) bool {
		for i := range reqs {
			if reqs[i].Key == k {
				return true
			}
		}
		return false
	}
	for _, si := range idx {
		sh := &s.shards[si]
		need := 0
		for i := range items {
			if items[i].sh != sh || sh.m[items[i].sk.key] != nil {
				continue
			}
			first := true // a key new under two algorithms is one key
			for j := 0; j < i; j++ {
				first = first && reqs[j].Key != reqs[i].Key
			}
			if first {
				need++
			}
		}
		if need > 0 {
			s.makeRoom(sh, now, need, inBatch)
		}
	}
}

// resolveBatch finds or creates each item's entry and fixes the cost it
// asks for, refusing a cost its limit can never admit.
func (s *Store) resolveBatch(reqs []weir.Request, items []batchItem) error {
	for i, r := range reqs {
		e, fresh, err := s.entryFor(items[i].sh, items[i].sk, r.Limit)
		if err != nil {
			return err
		}
		items[i].n = r.N
		if r.AtMost {
			items[i].n = min(r.N, e.c.params.MaxCost())
		}
		if err := weir.CheckCost(r.Key, items[i].n, e.c.params.MaxCost()); err != nil {
			return err
		}
		items[i].e, items[i].fresh = e, fresh
	}
	return nil
}

// decideBatch decides the batch all or nothing: when every item would be
// admitted, each one takes its cost; otherwise none does, and only the
// items that sank the batch record their rejection.
func (s *Store) decideBatch(reqs []weir.Request, items []batchItem, results []weir.Result, now int64) {
	all := true
	for i := range reqs {
		d := algorithm.Check(&items[i].e.c.params, &items[i].e.state, now, items[i].n, items[i].mode)
		results[i] = weir.ResultOf(d)
		all = all && d.Allowed
	}
	for i, r := range reqs {
		it := &items[i]
		var d algorithm.Decision
		switch {
		case all:
			d = algorithm.Take(&it.e.c.params, &it.e.state, now, it.n, it.mode)
			if d.Granted > 0 && r.Lease != "" {
				algorithm.SetLeaseID(&it.e.state, r.Lease)
			}
			results[i] = weir.ResultOf(d)
		case !results[i].Allowed:
			// The request that sank the batch: Take consumes nothing
			// but starts its penalty box.
			d = algorithm.Take(&it.e.c.params, &it.e.state, now, it.n, it.mode)
			results[i] = weir.ResultOf(d)
		default:
			results[i].Granted = 0
			results[i].Delay = 0
			continue
		}
		s.save(it.sh, it.sk, it.e, it.fresh, now, d.TTL, true)
	}
}

// Release implements weir.MultiStore.
func (s *Store) Release(ctx context.Context, key string, l weir.Limit, lease string) error {
	k, err := kindOf(l)
	if err != nil {
		return err
	}
	sk := stateKey{key, k}
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.get(sk); e != nil {
		algorithm.Release(&e.state, lease)
	}
	return nil
}

// Reset implements weir.Store.
func (s *Store) Reset(ctx context.Context, key string, l weir.Limit) error {
	k, err := kindOf(l)
	if err != nil {
		return err
	}
	sh := s.shardOf(key)
	sh.mu.Lock()
	sh.remove(stateKey{key, k})
	sh.mu.Unlock()
	return nil
}

// Len returns the number of keys held, expired ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// TTL returns how long key's state under l still matters, and whether the
// store holds any state for it. storetest uses it to check expiry.
func (s *Store) TTL(key string, l weir.Limit) (time.Duration, bool) {
	k, err := kindOf(l)
	if err != nil {
		return 0, false
	}
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.get(stateKey{key, k})
	now := s.micros()
	if e == nil || e.expires <= now {
		return 0, false
	}
	return time.Duration(e.expires-now) * time.Microsecond, true
}
