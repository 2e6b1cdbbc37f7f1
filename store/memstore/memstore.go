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
	shards   []shard
	mask     uint64
	seed     maphash.Seed
	now      func() time.Time // an injected clock; nil means clock
	clock    monoClock
	maxShard int
	nshards  int

	// Compiled limits are shared by every key under the same limit.
	limitsMu sync.Mutex
	limits   map[weir.Limit]*compiled
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
	s.limitsMu.Lock()
	defer s.limitsMu.Unlock()
	if c := s.limits[l]; c != nil {
		return c, nil
	}
	p, err := l.Compile()
	if err != nil {
		return nil, err
	}
	c := &compiled{l, p}
	if len(s.limits) < maxCompiled {
		s.limits[l] = c
	}
	return c, nil
}

type shard struct {
	mu sync.Mutex
	// m is keyed by the plain key, so lookups take Go's fast string-key
	// path; the rare key used under several algorithms chains its entries.
	m map[string]*entry
	_ [40]byte // keep neighbouring shards' mutexes off one cache line
}

type stateKey struct {
	key  string
	kind algorithm.Kind
}

type entry struct {
	kind    algorithm.Kind
	next    *entry    // the same key under another algorithm
	c       *compiled // the limit this state was last used with
	state   algorithm.State
	expires int64 // µs: the state no longer matters from here on
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
	e.kind = sk.kind
	e.next = sh.m[sk.key]
	sh.m[sk.key] = e
}

// remove deletes sk's entry, keeping any other algorithm's.
func (sh *shard) remove(sk stateKey) {
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

// WithMaxKeys bounds the number of keys held (DefaultMaxKeys by default).
func WithMaxKeys(n int) Option { return func(s *Store) { s.maxShard = n } }

// WithShards sets the number of shards, rounded up to a power of two
// (default 256).
func WithShards(n int) Option { return func(s *Store) { s.nshards = n } }

// New returns an empty Store.
func New(opts ...Option) *Store {
	s := &Store{maxShard: DefaultMaxKeys, nshards: 256, seed: maphash.MakeSeed(), limits: map[weir.Limit]*compiled{}}
	for _, o := range opts {
		o(s)
	}
	n := 1
	for n < s.nshards {
		n <<= 1
	}
	s.shards = make([]shard, n)
	s.mask = uint64(n - 1)
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	s.maxShard = max(s.maxShard/n, 1)
	s.clock.rebase()
	return s
}

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
	e = sh.get(sk)
	if e != nil && sameLimit(&e.c.limit, &l) {
		return e, false, nil
	}
	c, err := s.compile(l)
	if err != nil {
		return nil, false, err
	}
	if e == nil {
		e, fresh = &entry{}, true
	}
	e.c = c
	return e, fresh, nil
}

// sameLimit is l == m, ordered so the common case (an unchanged limit)
// costs a few integer compares.
func sameLimit(l, m *weir.Limit) bool {
	return l.Rate == m.Rate && l.Period == m.Period && l.Burst == m.Burst && l.Block == m.Block &&
		l.MaxDelay == m.MaxDelay && l.DelayAfter == m.DelayAfter && l.Algorithm == m.Algorithm
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
	k, err := kindOf(l)
	if err != nil {
		return weir.Result{}, err
	}
	sk := stateKey{key, k}
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, fresh, err := s.entryFor(sh, sk, l)
	if err != nil {
		return weir.Result{}, err
	}
	if mode == algorithm.AtMost {
		n = min(n, e.c.params.MaxCost()) // a partial grant may ask for more than fits
	}
	if err := weir.CheckCost(key, n, e.c.params.MaxCost()); err != nil {
		return weir.Result{}, err
	}
	now := s.micros()
	d := algorithm.Take(&e.c.params, &e.state, now, n, mode)
	if d.Granted > 0 && lease != "" {
		algorithm.SetLeaseID(&e.state, lease)
	}
	s.save(sh, sk, e, fresh, now, d.TTL, false)
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
		s.makeRoom(sh, now)
	}
	sh.put(sk, e)
}

// makeRoom sweeps a few expired keys and, if the shard is full, evicts one.
// The shard must be locked.
func (s *Store) makeRoom(sh *shard, now int64) {
	// Like Redis's active expiry: sample a few keys, drop the expired ones,
	// and sample again while at least half of a sample had expired.
	const sweep, rounds, sample = 4, 8, 16
	for r := 0; r < rounds; r++ {
		seen, expired := 0, 0
		for k, e := range sh.m { // map iteration starts at a random place
			if chainExpired(e, now) {
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
	if len(sh.m) < s.maxShard {
		return
	}
	var victim string
	soonest := int64(1<<63 - 1)
	i := 0
	for k, e := range sh.m {
		if chainExpired(e, now) {
			delete(sh.m, k)
			soonest = -1
		} else if e.expires < soonest {
			victim, soonest = k, e.expires
		}
		if i++; i >= sample {
			break
		}
	}
	if soonest >= 0 && len(sh.m) >= s.maxShard {
		delete(sh.m, victim)
	}
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
		mode := algorithm.Exact
		if r.AtMost {
			mode = algorithm.AtMost
		}
		res, err := s.take(r.Key, r.Limit, r.N, mode, r.Lease)
		results[0] = res
		return err
	}
	type item struct {
		sk    stateKey
		sh    *shard
		e     *entry
		fresh bool
		mode  algorithm.Mode
		n     int64
	}
	// Batches are small (one request per matched rule): keep them on the stack.
	var itemsBuf [8]item
	var idxBuf [8]int
	items := itemsBuf[:0]
	if len(reqs) > len(itemsBuf) {
		items = make([]item, 0, len(reqs))
	}
	items = items[:len(reqs)]
	idx := idxBuf[:0]
	for i, r := range reqs {
		k, err := kindOf(r.Limit)
		if err != nil {
			return err
		}
		for j := 0; j < i; j++ {
			if reqs[j].Key == r.Key && items[j].sk.kind == k {
				return fmt.Errorf("memstore: key %q appears twice in one batch", r.Key)
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
	idx = slices.Compact(idx)
	for _, si := range idx {
		s.shards[si].mu.Lock()
	}
	defer func() {
		for _, si := range idx {
			s.shards[si].mu.Unlock()
		}
	}()
	now := s.micros()
	// Sweep before any entry of the batch is resolved: a sweep run while
	// saving one member could otherwise drop another member's (expired)
	// entry after it was looked up, losing that member's new state.
	for i := range items {
		if items[i].sh.get(items[i].sk) == nil {
			s.makeRoom(items[i].sh, now)
		}
	}
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
	return nil
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
