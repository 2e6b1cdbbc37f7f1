// Package denycache answers certain denials from memory: an exact local
// deny cache in front of a shared store (redisstore).
//
// A denial is certain until its RetryAfter. A rejected request consumes
// nothing and a limit's state only recovers with time, so no request of the
// same or a larger cost on that key under that limit can be admitted
// earlier, whichever instance asks. Only a reset (an unblock is one), a rule
// change, or a release of a concurrency lease can make it wrong. The cache
// keeps each denial it sees, keyed by the key and the limit, and answers
// later requests of the same or a larger cost from memory until
// RetryAfter, measured from when the denied request was sent, so never later
// than the store's own answer would lapse. During a flood of an abusive
// key, Redis then sees about one call per RetryAfter per instance instead
// of one per request. When a denial lapses, the requests for its key that
// arrive while the first of them is at the store wait for its answer and
// are answered by its denial, if it brings one back (Store.join).
//
// Resets go through the Store, which drops the key's entry here and
// publishes the key on a Bus (NewRedisBus: Redis pub/sub) so that every
// instance drops it; Flush does the same for every key (weir serve calls it
// on a rule change). While the Bus is not subscribed the cache is empty and
// bypassed: nothing is answered from memory and nothing is kept, so a lost
// invalidation cannot leave a stale denial. Concurrency limits are never
// cached. docs/algorithms.md ("The deny cache") says which fields of a
// cached answer can differ from the store's, and by how much.
package denycache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
)

// DefaultSize is the most entries a cache keeps when Config.Size is zero.
const DefaultSize = 100_000

// MaxSize bounds Config.Size.
const MaxSize = 100_000_000

// Config tunes a Store.
type Config struct {
	// Size is the most denials kept (DefaultSize if zero). The cache is a
	// fixed array of buckets of 8 entries; a key can only sit in its own
	// bucket, and a full bucket evicts the entry that lapses first: a flood
	// of keys only lowers the hit ratio, never the exactness.
	Size int
	// Bus carries invalidations between the instances that share the
	// store. Without one the cache invalidates only locally: right for one
	// instance alone on its Redis, wrong for a fleet (see Store).
	Bus Bus
	// Clock, for tests, replaces the monotonic clock the cache measures
	// RetryAfter with; give it the store's clock (redisstore Config.Clock).
	Clock func() time.Time
	// Logger receives the rare events: the bus lost or back.
	Logger *slog.Logger
	// Timeout is the wrapped store's own deadline per call
	// (redisstore.Store.Timeout), which also bounds the publication of an
	// invalidation after a refund the store made by itself (default 1s).
	Timeout time.Duration
	// OnRefund, if set, is called once by New with the function the
	// wrapped store must call with the key of every take it gives back by
	// itself (redisstore.Store.OnRefund: a Cluster batch refunded across
	// hash slots), so that denials made meanwhile are dropped everywhere.
	OnRefund func(f func(ctx context.Context, key string))
}

// Store is a weir.Store that answers cached denials
// from memory and passes everything else to the store it wraps. It is safe
// for concurrent use. Build it with New; Close stops its subscription.
//
// Every instance that shares the wrapped store's state must reach the
// others through the same Bus, and must reset keys through its Store (or
// publish with Invalidate): an instance whose cache never hears of a reset
// keeps answering the old denial until it lapses.
type Store struct {
	next    weir.Store
	t       *table
	bus     Bus
	live    atomic.Bool // the bus is subscribed: the cache may answer and keep
	log     *slog.Logger
	timeout time.Duration

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// New wraps next. With a Bus, the cache starts bypassed and comes into use
// once the bus reports its subscription; without one it is in use at once.
func New(next weir.Store, cfg Config) (*Store, error) {
	if next == nil {
		return nil, errors.New("denycache: no store to wrap")
	}
	size := cfg.Size
	if size == 0 {
		size = DefaultSize
	}
	if size < 1 || size > MaxSize {
		return nil, fmt.Errorf("denycache: size %d is outside 1..%d", cfg.Size, MaxSize)
	}
	s := &Store{next: next, t: newTable(size, cfg.Clock), bus: cfg.Bus, log: cfg.Logger, done: make(chan struct{})}
	s.timeout = cfg.Timeout
	if s.log == nil {
		s.log = slog.Default()
	}
	if cfg.OnRefund != nil {
		cfg.OnRefund(s.refunded)
	}
	if s.bus == nil {
		s.live.Store(true)
		close(s.done)
		s.cancel = func() {}
		return s, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		s.bus.Run(ctx, s.deliver, s.setLive)
	}()
	return s, nil
}

// Close stops the subscription and empties the cache, which then passes
// every call to the wrapped store; the wrapped store stays open.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.cancel()
		<-s.done
		s.live.Store(false)
		s.t.flush(reasonBypass)
	})
	return nil
}

// Live reports whether the cache is in use: false while its bus is not
// subscribed.
func (s *Store) Live() bool { return s.live.Load() }

// setLive is the bus's report of its subscription. Either way every entry
// goes: while down, invalidations may be lost; once back, the ones lost
// meanwhile are unknown.
func (s *Store) setLive(up bool) {
	if s.live.Load() == up {
		return
	}
	if !up {
		s.live.Store(false)
		s.t.flush(reasonBypass)
		s.log.Warn("weir: deny cache bypassed: its invalidation channel is down")
		return
	}
	s.t.flush(reasonBypass)
	s.live.Store(true)
	s.log.Info("weir: deny cache in use: its invalidation channel is subscribed")
}

// deliver applies an invalidation from the bus.
func (s *Store) deliver(msg Message) {
	if msg.All {
		s.t.flush(reasonFlush)
		return
	}
	s.t.invalidateKey(msg.Key)
}

// cacheable reports whether denials under l may be cached: all but
// concurrency, whose releases give capacity back before any RetryAfter.
func cacheable(l weir.Limit) bool { return l.Algorithm != weir.Concurrency }

// keepable reports whether a denial under l may be kept, and the most l
// can admit at once (a larger cost is the store's error to return, never a
// cached denial). A penalty box shorter than the algorithm's own wait
// lapses while the key is still rejected, and the next rejection then
// starts a new box: those rejections change the state, so they must reach
// the store. A limit without a box, or whose box outlasts every wait
// (algorithm.Params.BoxOutlasts), has rejections that change nothing.
// Called on the miss path only.
func keepable(l weir.Limit) (maxCost int64, ok bool) {
	p, err := l.Compile()
	if err != nil || l.Block > 0 && !p.BoxOutlasts() {
		return 0, false
	}
	return p.MaxCost(), true
}

// Take answers a request of cost n >= 1 from a live cached denial, or asks
// the wrapped store and keeps its denial. A request that the key's lapsed
// denial would have answered, arriving while another such request is on
// its way to the store, waits for that one's answer (see join).
func (s *Store) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if n < 1 || !cacheable(l) || !s.live.Load() {
		return s.next.Take(ctx, key, l, n)
	}
	lc := s.t.locate(key)
	if r, ok := s.t.lookup(&lc, key, l, n, s.t.now()); ok {
		return r, nil
	}
	f, r, ok, err := s.join(ctx, &lc, key, l, n)
	if ok || err != nil {
		return r, err
	}
	if f != nil {
		defer f.end() // after the insert: the waiters look again
	}
	lc.sh.miss.Add(1)
	sent := s.t.now()
	epoch := lc.sh.epoch.Load()
	res, err := s.next.Take(ctx, key, l, n)
	if err == nil && !res.Allowed && res.RetryAfter > 0 && s.live.Load() {
		if maxCost, ok := keepable(l); ok {
			s.t.insert(&lc, key, l, n, maxCost, sent, epoch, &res)
		}
	}
	return res, err
}

// Do answers a take of one request as Take does; an at-most take
// (weir.ModeAtMost) is denied exactly when one event is, so it is
// answered by a denial of cost 1, and its own denials are not kept. A
// batch of several goes to the wrapped store. A debit or refund goes to
// the wrapped store (see debt); a release too (never cached, so nothing to
// drop); a reset resets the key in the wrapped store, then drops its entry
// here and publishes it to every instance on the bus, whatever the reset
// returned (a reset that failed may still have happened). An error
// publishing is returned: other instances may then answer the old denial
// until it lapses.
func (s *Store) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if len(reqs) == 1 {
		switch reqs[0].Mode {
		case weir.ModeDebit, weir.ModeRefund:
			return s.debt(ctx, reqs, results)
		case weir.ModeRelease:
			return s.next.Do(ctx, reqs, results)
		case weir.ModeReset:
			err := s.next.Do(ctx, reqs, results)
			return errors.Join(err, s.Invalidate(ctx, reqs[0].Key))
		}
	}
	if len(reqs) != 1 || len(results) < 1 || reqs[0].N < 1 || !cacheable(reqs[0].Limit) || !s.live.Load() {
		return s.next.Do(ctx, reqs, results)
	}
	rq := &reqs[0]
	atMost := rq.Mode == weir.ModeAtMost
	n := rq.N
	if atMost {
		n = 1
	}
	lc := s.t.locate(rq.Key)
	if r, ok := s.t.lookup(&lc, rq.Key, rq.Limit, n, s.t.now()); ok {
		results[0] = r
		return nil
	}
	f, r, ok, err := s.join(ctx, &lc, rq.Key, rq.Limit, n)
	if ok || err != nil {
		results[0] = r
		return err
	}
	if f != nil {
		defer f.end()
	}
	lc.sh.miss.Add(1)
	sent := s.t.now()
	epoch := lc.sh.epoch.Load()
	err = s.next.Do(ctx, reqs, results)
	// An at-most denial's RetryAfter is for its whole N, not for the one
	// event its denial proves unavailable: it is answered, never kept.
	if res := &results[0]; err == nil && !atMost && !res.Allowed && res.RetryAfter > 0 && s.live.Load() {
		if maxCost, ok := keepable(rq.Limit); ok {
			s.t.insert(&lc, rq.Key, rq.Limit, n, maxCost, sent, epoch, res)
		}
	}
	return err
}

// MaxHerd bounds the requests that wait at once for one lapsed denial's
// leader (see join); more go to the store at once, as without the wait.
const MaxHerd = 1024

// join handles a request of cost n that lookup has just failed to answer. If key's
// entry under l has lapsed and would have answered it, the first such
// request leads: join returns its flight, which the caller ends once its
// store's answer is kept (or not). Others that arrive while the leader is
// on its way wait for its answer (at most MaxHerd of them, each until its
// ctx ends) and look again: a denial the leader kept answers them from
// memory (ok), as a hit and a herd answer. If the leader left no denial (it
// was admitted, say), the next request leads a second flight, and the
// others wait for that one; after a second flight without a denial they go
// to the store. (A leader's own denial that lapsed meanwhile is a new entry,
// with flights of its own.)
// A request the entry would not have answered, or one for a key without an
// entry, goes to the store at once.
//
// Exact: a waiter is answered only by lookup, at a moment after the
// leader's answer came back, so after Redis decided it; the kept denial
// lapses at the leader's send time plus RetryAfter, never later than in
// Redis; an invalidation while the leader was out leaves no entry (insert's
// epoch), so the waiters go to the store. No lock is held while waiting.
func (s *Store) join(ctx context.Context, lc *loc, key string, l weir.Limit, n int64) (lead *flight, r weir.Result, ok bool, err error) {
	// The caller's lookup missed: look again only after a wait, or when an
	// entry was kept since.
	var ended *flight // an ended flight met once: its answer may have just been kept
	for look, waited := false, false; ; look = true {
		now := s.t.now()
		if waited && !s.live.Load() {
			return nil, weir.Result{}, false, nil
		}
		if look {
			if r, ok := s.t.lookup(lc, key, l, n, now); ok {
				if waited {
					lc.sh.herd.Add(1)
				}
				return nil, r, true, nil
			}
		}
		e := lc.find(key)
		if e == nil || e.lim != l || n < e.n || n > e.maxCost {
			return nil, weir.Result{}, false, nil
		}
		if now < e.exp {
			continue // kept since the lookup: it answers
		}
		// Up to two flights per lapse: if the first leader was admitted
		// (a bucket's one unit that came back, or a window's first), the
		// next request leads a second, whose denial, if any, answers the
		// rest. After the second, everyone goes to the store.
		f := e.flight.Load()
		if f == nil || f.ended() && f.gen == 1 {
			nf := &flight{done: make(chan struct{}), gen: 1}
			if f != nil {
				nf.gen = 2
			}
			if e.flight.CompareAndSwap(f, nf) {
				return nf, weir.Result{}, false, nil
			}
			f = e.flight.Load()
		}
		if f.ended() && f != ended {
			// It ended between this request's lookup and now (another
			// request made it and it was quick): look once more, since
			// its denial, if it left one, answers.
			ended = f
			continue
		}
		if f.ended() || f.waiters.Add(1) > MaxHerd {
			// The last leader's answer did not leave a denial (an
			// admission, an error, an invalidation): no more waiting on
			// this entry.
			return nil, weir.Result{}, false, nil
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, weir.Result{}, false, fmt.Errorf("%w: denycache: %w while waiting for the store's answer to an earlier request on the same key", weir.ErrNotSent, ctx.Err())
		}
		waited = true
	}
}

// end lets the flight's waiters look again.
func (f *flight) end() { close(f.done) }

// debt passes a debit or a refund (a batch of one, weir.Request.Mode) to
// the wrapped store: a debit must always consume there, so it is never
// answered from memory, and its result (which may say the debit did not
// fit) is not kept. A refund gives capacity back, which can make a cached
// denial of the key wrong: the key's entries are dropped here once the
// refund is done (a reply sent before then is not kept either, as after a
// reset) and on every instance through the bus. A failure to publish is
// logged, not returned: the refund itself was made.
func (s *Store) debt(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	err := s.next.Do(ctx, reqs, results)
	if reqs[0].Mode == weir.ModeRefund {
		if perr := s.Invalidate(ctx, reqs[0].Key); perr != nil {
			s.log.Warn("weir: deny cache: publishing the invalidation after a refund failed; other instances may answer the old denial until it lapses", "err", perr)
		}
	}
	return err
}

// refunded is the wrapped store's refund callback (Config.OnRefund): capacity came back to
// key, so a denial of it made between the take and the refund, here or on
// another instance, may be wrong. It drops the key's entries here and on
// every instance, as after a reset; a failure to publish is logged.
func (s *Store) refunded(ctx context.Context, key string) {
	d := s.timeout
	if d <= 0 {
		d = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := s.Invalidate(ctx, key); err != nil {
		s.log.Warn("weir: deny cache: publishing the invalidation after a Cluster batch's refund failed; other instances may answer the old denial until it lapses", "err", err)
	}
}

// Invalidate drops key's entries (under every limit) here and on every
// instance of the bus. Call it after changing a key's state in the shared
// store other than through Take (a reset through Do calls it).
func (s *Store) Invalidate(ctx context.Context, key string) error {
	s.t.invalidateKey(key)
	if s.bus == nil {
		return nil
	}
	if err := s.bus.Publish(ctx, Message{Key: key}); err != nil {
		return fmt.Errorf("%w: denycache: publishing the invalidation of a key: %w", weir.ErrStore, err)
	}
	return nil
}

// Flush drops every entry here and on every instance of the bus: after a
// rule change, whose limits may now share a key's state with others.
func (s *Store) Flush(ctx context.Context) error {
	s.t.flush(reasonFlush)
	if s.bus == nil {
		return nil
	}
	if err := s.bus.Publish(ctx, Message{All: true}); err != nil {
		return fmt.Errorf("%w: denycache: publishing a flush: %w", weir.ErrStore, err)
	}
	return nil
}

// Stats are the cache's counters since New.
type Stats struct {
	Hits int64 // requests answered from memory
	// Herd counts the hits that waited for another request on a lapsed
	// denial's key (the leader) and were answered by the denial it kept.
	Herd      int64
	Misses    int64 // cacheable requests passed to the store
	Evictions int64 // entries dropped to make room
	// Invalidations counts by reason: "reset" (a key, here or from the
	// bus), "flush" (every key: a rule change), "subscription" (every key:
	// the bus was lost or came back).
	Invalidations map[string]int64
	Entries       int  // entries held, lapsed ones included
	Live          bool // the cache is in use (its bus is subscribed)
}

// Stats returns the counters.
func (s *Store) Stats() Stats {
	st := Stats{Evictions: s.t.evictions.Load(), Entries: s.t.len(), Live: s.live.Load(), Invalidations: map[string]int64{}}
	for i := range s.t.shards {
		st.Hits += s.t.shards[i].hits.Load()
		st.Misses += s.t.shards[i].miss.Load()
		st.Herd += s.t.shards[i].herd.Load()
	}
	for i, name := range reasonNames {
		st.Invalidations[name] = s.t.invalidations[i].Load()
	}
	return st
}

// hits counts the requests answered from memory.
func (s *Store) hits() int64 {
	var n int64
	for i := range s.t.shards {
		n += s.t.shards[i].hits.Load()
	}
	return n
}

// Reasons lists the invalidation reasons Stats reports.
func Reasons() []string { return append([]string(nil), reasonNames[:]...) }

var _ weir.Store = (*Store)(nil)
