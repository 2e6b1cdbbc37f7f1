// Package memstore is weir's in-memory Store: one process, zero set-up.
//
// Keys are spread over shards, each with its own mutex, so goroutines
// working on different keys rarely contend. Each shard is an open-addressed
// table whose 64-byte slots hold a key's state inline (table.go, state.go),
// so that a decision on a key not in cache costs one cache miss for its
// state. The number of keys is bounded:
// each key's state carries the instant after which it no longer matters
// (its TTL), every insertion sweeps a couple of keys whose TTL has passed,
// and a full shard first drops expired keys and otherwise, in the order a
// moving hand reaches them, a key whose state refuses nothing: a penalty
// box in force or a counter at its limit is evicted only when the next 64
// keys all are one. Evicting live state forgets a limit early, so size
// MaxKeys for the keys you expect within the longest period.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// DefaultMaxKeys is the default bound on the number of keys held.
const DefaultMaxKeys = 1 << 20

// Store is the in-memory store. The zero value is not usable; call New.
type Store struct {
	shards  []shard
	hints   []hint // where each shard's table is (prefetch.go)
	mask    uint64
	seed    maphash.Seed
	now     func() time.Time // an injected clock; nil means clock
	clock   monoClock
	maxKeys int
	nshards int

	// Compiled limits are shared by every key under the same limit.
	limitsMu sync.Mutex
	limits   map[weir.Limit]*compiled

	// last is the limit compiled most recently: a new key under the
	// same limit as the previous one finds it without the lock.
	last atomic.Pointer[compiled]

	ovrs atomic.Pointer[overrides] // nil until an override is set (override.go)
	evts atomic.Pointer[evState]   // nil until event rules are set (events.go)
	evMu sync.Mutex                // serialises SetEventRules
	due  dueHeap                   // box ends and override expiries for the sweeper (events.go)
	// ovrMax is the bound on overrides, if not override.MaxOverrides (tests).
	ovrMax int
}

// maxCompiled bounds the shared-limit cache; beyond it (a program that
// makes limits per key) each entry compiles its own.
const maxCompiled = 4096

type compiled struct {
	limit  weir.Limit
	params algorithm.Params
	lay    layout // how a state under it packs into a slot (state.go)
	plain  bool   // a decision under it keeps a packed state packed (plainOf)
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
	lay := layoutOf(&p)
	c := &compiled{l, p, lay, plainOf(&p, lay)}
	if len(s.limits) < maxCompiled {
		s.limits[l] = c
		s.last.Store(c)
	}
	return c, nil
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
	s.hints = make([]hint, n)
	s.mask = uint64(n - 1)
	// The shards share MaxKeys exactly: the first MaxKeys%n get one more.
	for i := range s.shards {
		s.shards[i].hint = &s.hints[i]
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

// hash returns key's shard and its hash's high half (the tag).
func (s *Store) hash(key string) (*shard, uint32) {
	h := maphash.String(s.seed, key)
	return &s.shards[h&s.mask], uint32(h >> 32)
}

// hashIndex returns the index of key's shard and its tag.
func (s *Store) hashIndex(key string) (int, uint32) {
	h := maphash.String(s.seed, key)
	return int(h & s.mask), uint32(h >> 32)
}

// sameLimit is l == m, written so that the common case (an unchanged
// limit) costs a few loads, XORs and one branch: the integer fields are
// folded into one word (comparing the structs whole calls
// runtime.memequal, and comparing field by field branches at each), and
// the strings, most often the very same constants, are compared by pointer
// first.
func sameLimit(l, m *weir.Limit) bool {
	x := uint64(l.Rate^m.Rate) | uint64(l.Period^m.Period) | uint64(l.Burst^m.Burst) | uint64(l.Block^m.Block) |
		uint64(l.MaxDelay^m.MaxDelay) | uint64(l.DelayAfter^m.DelayAfter) | uint64(l.Buckets^m.Buckets) |
		uint64(l.ForgetAfter^m.ForgetAfter) | uint64(l.ResetAt^m.ResetAt) | uint64(l.Warmup^m.Warmup) | uint64(l.Calendar^m.Calendar)
	for i := range l.Escalate {
		x |= uint64(l.Escalate[i] ^ m.Escalate[i])
	}
	return x == 0 && sameString(string(l.Algorithm), string(m.Algorithm)) && sameString(l.Timezone, m.Timezone)
}

// sameString is a == b, without a call when both are the same bytes.
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}

func kindOf(l weir.Limit) (algorithm.Kind, error) {
	k, ok := l.Algorithm.Kind()
	if !ok {
		return 0, l.Validate()
	}
	return k, nil
}

// checkKey refuses a key longer than a slot holds.
func checkKey(key string) error {
	if uint64(len(key)) > maxKeyLen {
		return fmt.Errorf("memstore: a key of %d bytes is longer than the %d a key may have", len(key), uint64(maxKeyLen))
	}
	return nil
}

// resolve finds key's slot under l's algorithm, or -1 if it holds none,
// and the limit compiled, updating the slot's limit if it changed. The
// shard must be locked.
func (s *Store) resolve(sh *shard, key string, tag uint32, l *weir.Limit) (int, *compiled, error) {
	// The common case first: the key holds a state last used with this
	// very limit (so of its algorithm), found without parsing the
	// algorithm's name or looking at the compiled-limit cache.
	if i := sh.findLimit(key, tag, l); i >= 0 {
		return i, sh.slots[i].c, nil
	}
	k, err := kindOf(*l)
	if err != nil {
		return -1, nil, err
	}
	if err := checkKey(key); err != nil {
		return -1, nil, err // a key too long is never held: refused here
	}
	c, err := s.compile(*l)
	if err != nil {
		return -1, nil, err
	}
	i := sh.findKind(key, tag, k)
	if i >= 0 {
		sl := &sh.slots[i]
		if sl.c.limit.Warmup != l.Warmup {
			// A warm-up counts in other units and, in Redis, under another
			// key: switching it on or off starts the key afresh.
			sl.v, sl.x = [3]int64{}, nil
		}
		sl.c = c
	}
	return i, c, nil
}

// open returns the State a decision on slot i (-1: a new key) under c
// runs on: the slot's own, or the scratch st loaded from the slot.
func (sh *shard) open(i int, c *compiled, st *algorithm.State) *algorithm.State {
	if i < 0 {
		unpack(layoutNone, nil, st)
		return st
	}
	sl := &sh.slots[i]
	if sl.x != nil {
		return sl.x
	}
	unpack(c.lay, &sl.v, st)
	return st
}

// keep stores st, which open returned for sl, back into sl.
func keep(sl *slot, st *algorithm.State) {
	if st == sl.x || pack(sl.c.lay, st, &sl.v) {
		return
	}
	sl.x = spill(st)
}

// Take implements weir.Store.
func (s *Store) Take(ctx context.Context, key string, l weir.Limit, n int64) (r weir.Result, err error) {
	req := weir.Request{Key: key, N: n} // its limit is l: not copied
	err = s.take(&req, &l, false, &r)
	return r, err
}

// take decides req (a take, at-most take, debit or undated refund) under
// l (req.Limit, or Take's own) into r, the caller's Result, so that the
// Result is built where it is returned instead of being copied out
// through each frame. req is checked by Request.CheckWith once l is
// compiled. With date, an admitted take of n > 0 in full gets its time
// (Result.At).
func (s *Store) take(req *weir.Request, l *weir.Limit, date bool, r *weir.Result) error {
	key, n, mode := req.Key, req.N, req.AlgorithmMode()
	si, tag := s.hashIndex(key)
	s.prefetchSlot(uint64(si), tag)
	sh := &s.shards[si]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// The clock is read under the lock (so that decisions on a key see
	// time in the order they take it) and before the slot is looked at:
	// the slot's line, prefetched, is on its way meanwhile.
	now := s.micros()
	baseMax := int64(-1)
	if o := s.ovrs.Load(); o != nil {
		if ol := s.overridden(o, si, key, l); ol != l {
			// The cost is checked against the caller's limit first, as
			// the Redis store does before its script reads the override.
			bm, err := s.baseMax(*l, mode)
			if err != nil {
				return err
			}
			baseMax, l = bm, ol
		}
	}
	i, c, err := s.resolve(sh, key, tag, l)
	if err != nil {
		return err
	}
	if baseMax >= 0 {
		// The cost against the caller's limit (baseMax), as the Redis
		// store checks it before its script reads the override.
		if mode == algorithm.AtMost {
			n = min(n, baseMax)
		}
		if n < 0 || n > baseMax {
			return weir.CheckCost(key, n, baseMax)
		}
	}
	if err := req.CheckWith(&c.params); err != nil {
		return err
	}
	if mode == algorithm.AtMost {
		n = min(n, c.params.MaxCost()) // a partial grant may ask for more than fits
	}
	var d algorithm.Outcome
	if i >= 0 && c.plain && mode < algorithm.Debit && sh.slots[i].x == nil {
		// The common case: a packed state under a limit whose decisions
		// keep it packed. Its integers go back to the slot without pack's
		// look at every other field of the State.
		sl := &sh.slots[i]
		unpack(c.lay, &sl.v, &sh.scratch)
		algorithm.TakeTo(&c.params, &sh.scratch, now, n, mode, &d)
		storePacked(c.lay, &sh.scratch, &sl.v)
		sl.expires = now + d.TTL
		if e := s.evts.Load(); e != nil {
			s.fire(e, sh, key, n, c, &d, now)
		}
		r.SetOutcome(&d)
		if date && d.Allowed && n > 0 && d.Granted == n {
			r.At = now
		}
		return nil
	}
	st := sh.open(i, c, &sh.scratch)
	algorithm.TakeTo(&c.params, st, now, n, mode, &d)
	if d.Granted > 0 && req.Lease != "" {
		algorithm.SetLeaseID(st, req.Lease)
	}
	if i >= 0 {
		sl := &sh.slots[i]
		keep(sl, st)
		sl.expires = now + d.TTL
	} else {
		s.add(sh, key, tag, c, st, now, d.TTL, false)
	}
	if e := s.evts.Load(); e != nil {
		s.fire(e, sh, key, n, c, &d, now)
	}
	r.SetOutcome(&d)
	if date && d.Allowed && n > 0 && d.Granted == n {
		r.At = now
	}
	return nil
}

// add inserts a new key's state st (a scratch State, left with only
// packed fields set) under c if it matters, first making room unless the
// caller already did.
func (s *Store) add(sh *shard, key string, tag uint32, c *compiled, st *algorithm.State, now, ttl int64, swept bool) {
	if ttl <= 0 {
		*st = algorithm.State{} // an untouched key: nothing worth keeping
		return
	}
	if !swept {
		need := 1
		if sh.findKey(key, tag) >= 0 {
			need = 0 // held under another algorithm: no new key
		}
		s.makeRoom(sh, now, need, nil)
	}
	if sh.keys >= sh.limit && sh.findKey(key, tag) < 0 {
		// A batch with more new keys than its shard holds: the state is
		// forgotten at once, as if evicted, so the bound always holds.
		*st = algorithm.State{}
		return
	}
	sl := slot{key: unsafe.Pointer(unsafe.StringData(key)), klen: uint32(len(key)), tag: tag, c: c, expires: now + ttl}
	if !pack(c.lay, st, &sl.v) {
		sl.x = spill(st)
	}
	sh.insert(sl)
}

// makeRoom sweeps a few expired keys and then, while the shard has no
// room for need more keys, evicts: never a key for which protect (if not
// nil) is true. The shard must be locked.
func (s *Store) makeRoom(sh *shard, now int64, need int, protect func(string) bool) {
	// Like Redis's active expiry: sample a few keys, drop the expired ones,
	// and sample again while at least half of a sample had expired.
	const sweep, rounds = 4, 8
	for r := 0; r < rounds && sh.used > 0; r++ {
		var gone [sweep]int
		expired := 0
		for j := 0; j < sweep && j < sh.used; j++ {
			i := sh.next()
			sl := &sh.slots[i]
			k := sl.keyString()
			if sh.keyExpired(k, sl.tag, now) && (protect == nil || !protect(k)) {
				gone[expired] = i
				expired++
			}
		}
		sh.dropKeys(gone[:expired])
		if expired*2 < sweep {
			break
		}
	}
	for sh.keys+need > sh.limit {
		if !s.evict(sh, now, protect) {
			return
		}
	}
}

// dropKeys removes the keys of the slots at idx, every algorithm's state
// under each. Slots move as keys go, so it reads every key first.
func (sh *shard) dropKeys(idx []int) {
	var keys [16]string
	var tags [16]uint32
	for j, i := range idx {
		keys[j], tags[j] = sh.slots[i].keyString(), sh.slots[i].tag
	}
	for j := range idx {
		sh.removeKey(keys[j], tags[j]) // a key sampled twice goes once
	}
}

// Eviction looks at keys in the order a moving hand (the shard's hand)
// reaches them, which is the order of their hashes' slots: nothing a
// client chooses, neither its keys nor how long their state lasts, moves
// its state ahead or behind another's. Among the keys it looks at, a full
// shard drops the expired ones or else the first one that enforces
// nothing (see keyEnforcing): a penalty box in force, or a counter that
// refuses, is never evicted to make room while the hand finds a key that
// refuses nothing within evictReach keys.
const (
	evictSample = 16 // keys looked at, at least, for expired ones
	evictReach  = 64 // keys looked at, at most, for one that enforces nothing
)

// evict drops the expired keys among the next evictSample the hand
// reaches or, if none had expired, the first of the next evictReach that
// enforces nothing; if every one of those enforces, the first of them.
// Keys for which protect (if not nil) is true are never dropped; if only
// those were reached, every slot is looked at. It reports whether it
// dropped any. The shard must be locked.
func (s *Store) evict(sh *shard, now int64, protect func(string) bool) bool {
	if sh.used == 0 {
		return false
	}
	var gone [evictSample]int
	expired, victim, enforcing := 0, -1, -1
	for j := 0; j < evictReach && j < sh.used; j++ {
		if j >= evictSample && (expired > 0 || victim >= 0) {
			break
		}
		i := sh.next()
		sl := &sh.slots[i]
		k := sl.keyString()
		switch {
		case protect != nil && protect(k):
		case sh.keyExpired(k, sl.tag, now):
			if expired < len(gone) {
				gone[expired] = i
				expired++
			}
		case victim >= 0:
		case sh.keyEnforcing(k, sl.tag, now):
			if enforcing < 0 {
				enforcing = i
			}
		default:
			victim = i
		}
	}
	if expired > 0 {
		sh.dropKeys(gone[:expired])
		return true
	}
	if victim < 0 && enforcing < 0 && protect != nil {
		// Only protected keys were reached: look at them all.
		for i := range sh.slots {
			sl := &sh.slots[i]
			if sl.c == nil || protect(sl.keyString()) {
				continue
			}
			if !sh.keyEnforcing(sl.keyString(), sl.tag, now) {
				victim = i
				break
			}
			if enforcing < 0 {
				enforcing = i
			}
		}
	}
	if victim < 0 {
		victim = enforcing
	}
	if victim < 0 {
		return false
	}
	sh.dropKeys([]int{victim})
	return true
}

// release gives back the concurrency lease held on key (ModeRelease).
func (s *Store) release(key string, l weir.Limit, lease string) error {
	k, err := kindOf(l)
	if err != nil {
		return err
	}
	sh, tag := s.hash(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i := sh.findKind(key, tag, k); i >= 0 {
		sl := &sh.slots[i]
		st := sh.open(i, sl.c, &sh.scratch)
		algorithm.Release(st, lease)
		keep(sl, st)
	}
	return nil
}

// reset clears key's state under l (ModeReset).
func (s *Store) reset(key string, l weir.Limit) error {
	k, err := kindOf(l)
	if err != nil {
		return err
	}
	sh, tag := s.hash(key)
	sh.mu.Lock()
	sh.removeKind(key, tag, k)
	s.resetEvents(sh, key, s.micros())
	sh.mu.Unlock()
	return nil
}

// Len returns the number of keys held, expired ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.keys
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
	sh, tag := s.hash(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.findKind(key, tag, k)
	now := s.micros()
	if i < 0 || sh.slots[i].expires <= now {
		return 0, false
	}
	return time.Duration(sh.slots[i].expires-now) * time.Microsecond, true
}
