// Package guard protects a program from a failing weir.Store: Guard wraps
// a store with a deadline per call and a circuit breaker, and holds the
// in-process store that a local fallback decides with while the store is
// down (Fallback). Package policy puts every rule set behind one; so does
// weir serve.
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/protect"
	"github.com/weir-dev/weir/store/memstore"
)

// ErrCircuitOpen is returned, without touching the store, while the circuit
// breaker is open. It wraps weir.ErrStore.
var ErrCircuitOpen = fmt.Errorf("%w: circuit breaker open", weir.ErrStore)

// BreakerState is the state of a Guard's circuit breaker. It is
// protect.State, the one breaker state type, whose String gives the
// names metrics use: "closed", "open" or "half_open".
type BreakerState = protect.State

// The breaker's states: closed lets every call through; open fails every
// call at once; half-open lets one probe through to test the store.
const (
	BreakerClosed   = protect.Closed
	BreakerOpen     = protect.Open
	BreakerHalfOpen = protect.HalfOpen
)

// BreakerConfig tunes the circuit breaker. Zero fields take the defaults.
type BreakerConfig struct {
	// Failures is how many consecutive failures open the breaker (default 5).
	// Failures of calls that were in flight together count once: a
	// coalescing store fails a whole batch, or every caller waiting on it,
	// for one slow or failed call to the store, and that is one failure.
	Failures int
	// FailureRatio opens the breaker when at least this share of the calls
	// in the current Window failed, once MinRequests calls were made
	// (default 0.5; above 1 disables the ratio).
	FailureRatio float64
	// MinRequests is how many calls a Window needs before FailureRatio
	// applies (default 20).
	MinRequests int
	// Window is the span over which the ratio is counted (default 10s).
	Window time.Duration
	// Cooldown is how long the breaker stays open before it lets one probe
	// through (default 1s).
	Cooldown time.Duration
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Failures <= 0 {
		c.Failures = 5
	}
	if c.FailureRatio <= 0 {
		c.FailureRatio = 0.5
	}
	if c.MinRequests <= 0 {
		c.MinRequests = 20
	}
	if c.Window <= 0 {
		c.Window = 10 * time.Second
	}
	if c.Cooldown <= 0 {
		c.Cooldown = time.Second
	}
	return c
}

// Config configures a Guard. Zero fields take the defaults.
type Config struct {
	// Timeout is the deadline of every store call (default 50ms).
	Timeout time.Duration
	// Breaker tunes the circuit breaker.
	Breaker BreakerConfig
	// LocalMaxKeys bounds the local fallback store (default 65536 keys).
	LocalMaxKeys int
	// Logger receives a store outage's lines (default slog.Default()): one
	// when the breaker opens, one a minute while it stays open (logged by
	// the first call after each minute), one when it closes again; and, at
	// most once per LogInterval, a summary of store failures while the
	// breaker is closed.
	Logger *slog.Logger
	// LogInterval is the least time between two failure log lines while the
	// breaker is closed (default 10s).
	LogInterval time.Duration
	// OnStateChange, if set, is called on every breaker transition, in
	// order, for metrics. It must not block; it may call the Guard.
	OnStateChange func(from, to BreakerState)
	// Now is the clock (default time.Now). Tests step it.
	Now func() time.Time
	// StoreTimeout is the store's own deadline per call, if it ends every
	// call by one (redisstore.Store.Timeout): when it is no longer than
	// Timeout, the guard sets no deadline of its own, which would only
	// cost a timer per call.
	StoreTimeout time.Duration
	// NoDeadline says that the store never waits (memstore): the guard
	// sets no deadline of its own. Whoever composes the stack knows the
	// store and says so here; the guard does not look.
	NoDeadline bool
}

// DefaultTimeout is the deadline of a store call when store.timeout is not set.
const DefaultTimeout = 50 * time.Millisecond

// Guard protects its callers from a failing store. It wraps the store
// with a deadline per call and a circuit breaker, and holds the local
// in-memory store that the local fallback (on_error: local) decides with.
//
// The breaker is closed while the store answers. It opens after
// Breaker.Failures consecutive failures, or when Breaker.FailureRatio of the
// calls in a window fail; while open, every call fails at once with
// ErrCircuitOpen, so a dead Redis costs microseconds rather than a timeout
// per request. After Breaker.Cooldown one call is let through as a probe
// (half-open): its success closes the breaker, its failure opens it again.
// Only a call that reached the store decides a probe: one refused as
// invalid (checked before the breaker admits it), never sent
// (weir.ErrNotSent) or given up by its caller leaves the breaker half-open,
// and the next call probes.
//
// A Guard outlives rule sets: build it once with the store and pass it to
// every policy.New, so that a reload keeps the breaker's state and the
// fallback counters.
type Guard struct {
	store      weir.Store
	local      *memstore.Store
	timeout    time.Duration
	noDeadline bool // the store ignores contexts (memstore) or has its own deadline: skip the timer
	cfg        BreakerConfig
	log        *slog.Logger
	logEvery   time.Duration
	onState    func(from, to BreakerState)
	now        func() time.Time

	state atomic.Int32 // BreakerState; read without the lock on the fast path

	// The counters the breaker opens on, kept in atomics so that a healthy
	// call takes no lock.
	consecutive atomic.Int64
	// failEpoch counts the failures counted: a call that fails after
	// another failure was counted while it was in flight (the epoch moved
	// since it started) failed in the same incident and is not counted.
	failEpoch atomic.Int64
	winStart  atomic.Int64 // unix nanos
	winCalls  atomic.Int64
	winFails  atomic.Int64

	mu       sync.Mutex // guards transitions, openedAt, probing, pending and outage
	openedAt time.Time
	probing  bool
	pending  []transitionEvent // transitions not yet logged and reported
	outage   outage            // the current outage, while the breaker is not closed

	notifyMu sync.Mutex // keeps transition reports in order

	failures  atomic.Uint64 // calls that failed, breaker rejections excluded
	rejected  atomic.Uint64 // calls failed fast by the open breaker
	fallbacks atomic.Uint64 // requests decided by Fallback
	unlogged  atomic.Uint64 // failures since the last log line
	lastLog   atomic.Int64  // unix nanos of the last failure log line
}

// The messages of a store outage's log lines (see Config.Logger).
const (
	msgOutageStarted = "weir: store outage started; rules fall back to their on_error policy"
	msgStillDown     = "weir: store still down"
	msgOutageEnded   = "weir: store outage ended; the store answers again"
	msgFailing       = "weir: store failing"
)

// outageLogEvery is the time between two "still down" lines of an outage.
const outageLogEvery = time.Minute

// outage is what the log lines of a store outage report: when it started,
// when it was last logged, and the counters when it started.
type outage struct {
	start, logged                 time.Time
	failures, rejected, fallbacks uint64
}

// outageCounts is what happened during an outage so far: the store calls
// that failed, the calls the open breaker refused and the requests the
// fallback decided.
type outageCounts struct {
	duration                      time.Duration
	failures, rejected, fallbacks uint64
}

// counts returns what happened since o started. g.mu must be held.
func (g *Guard) counts(now time.Time) outageCounts {
	o := &g.outage
	return outageCounts{
		duration:  now.Sub(o.start),
		failures:  g.failures.Load() - o.failures,
		rejected:  g.rejected.Load() - o.rejected,
		fallbacks: g.fallbacks.Load() - o.fallbacks,
	}
}

func (c outageCounts) attrs(args ...any) []any {
	return append(args, "duration", c.duration, "failures", c.failures, "rejected", c.rejected, "fallbacks", c.fallbacks)
}

// transitionEvent is a breaker transition waiting for flush, with what its
// log line reports.
type transitionEvent struct {
	from, to BreakerState
	err      error        // the failure that started an outage
	counts   outageCounts // an ended outage's
}

// New wraps store. A nil store gets a fresh memstore (and no deadline).
func New(store weir.Store, cfg Config) *Guard {
	if store == nil {
		store, cfg.NoDeadline = memstore.New(), true
	}
	g := &Guard{
		store:    store,
		timeout:  cfg.Timeout,
		cfg:      cfg.Breaker.withDefaults(),
		log:      cfg.Logger,
		logEvery: cfg.LogInterval,
		onState:  cfg.OnStateChange,
		now:      cfg.Now,
	}
	if g.timeout <= 0 {
		g.timeout = DefaultTimeout
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.logEvery <= 0 {
		g.logEvery = 10 * time.Second
	}
	if g.now == nil {
		g.now = time.Now
	}
	maxKeys := cfg.LocalMaxKeys
	if maxKeys <= 0 {
		maxKeys = 1 << 16
	}
	g.local = memstore.New(memstore.WithMaxKeys(maxKeys), memstore.WithShards(16), memstore.WithClock(g.now))
	// A store that never waits, or that ends every call by its own
	// deadline: a deadline here would only cost a timer.
	g.noDeadline = cfg.NoDeadline
	if cfg.StoreTimeout > 0 && cfg.StoreTimeout <= g.timeout {
		// The store ends every call by its own timeout: a timer per call
		// here would only cost (about 2 µs and 500 bytes a call).
		g.noDeadline = true
	}
	return g
}

// Store returns the wrapped store.
func (g *Guard) Store() weir.Store { return g.store }

// Local returns the in-memory store that on_error: local falls back to.
func (g *Guard) Local() *memstore.Store { return g.local }

// State returns the breaker's state.
func (g *Guard) State() BreakerState {
	s := BreakerState(g.state.Load())
	if s == BreakerOpen {
		g.mu.Lock()
		if g.now().Sub(g.openedAt) >= g.cfg.Cooldown && !g.probing {
			s = BreakerHalfOpen // the next call will probe
		}
		g.mu.Unlock()
	}
	return s
}

// Failures returns how many store calls have failed.
func (g *Guard) Failures() uint64 { return g.failures.Load() }

// Rejected returns how many calls the open breaker failed without
// touching the store.
func (g *Guard) Rejected() uint64 { return g.rejected.Load() }

// retryHint is how long a caller refused by on_error: deny should wait: the
// rest of the breaker's cooldown, at least a second.
func (g *Guard) retryHint() time.Duration {
	if BreakerState(g.state.Load()) == BreakerOpen {
		g.mu.Lock()
		left := g.cfg.Cooldown - g.now().Sub(g.openedAt)
		g.mu.Unlock()
		if left > time.Second {
			return left
		}
	}
	return time.Second
}

// admit asks the breaker whether a call may go to the store.
func (g *Guard) admit() (probe bool, err error) {
	if BreakerState(g.state.Load()) == BreakerClosed {
		return false, nil
	}
	defer g.flush()
	g.mu.Lock()
	defer g.mu.Unlock()
	switch BreakerState(g.state.Load()) {
	case BreakerClosed:
		return false, nil
	case BreakerOpen:
		if g.now().Sub(g.openedAt) < g.cfg.Cooldown {
			break
		}
		g.transition(BreakerHalfOpen, nil)
		fallthrough
	case BreakerHalfOpen:
		if !g.probing {
			g.probing = true
			return true, nil
		}
	}
	g.rejected.Add(1)
	return false, ErrCircuitOpen
}

// outcome classifies a store call's result for the breaker.
type outcome uint8

const (
	success      outcome = iota // the store answered
	failure                     // the store is unhealthy
	inconclusive                // says nothing of the store's health
)

func classify(parent context.Context, err error) outcome {
	switch {
	case err == nil:
		return success
	case errors.Is(err, weir.ErrInvalidLimit) || errors.Is(err, weir.ErrInvalidCost) || errors.Is(err, weir.ErrUnsupported):
		// A request refused as invalid: stores refuse it before they send
		// anything (redisstore does), so it proves nothing about the store.
		// As a half-open probe it must not close the breaker, and while
		// closed it neither counts as a call nor resets the failure run.
		return inconclusive
	case errors.Is(err, weir.ErrNotSent):
		// Never sent (it queued past its deadline behind other calls): the
		// store was not asked, so it can be neither blamed nor cleared.
		return inconclusive
	case parent.Err() != nil:
		// The caller gave up (cancelled, or its own deadline passed, as
		// Envoy's 20ms rate-limit timeout does under load): the store is
		// not to blame. Had the guard's own, shorter timeout fired, the
		// caller's context would still be live here.
		return inconclusive
	}
	return failure
}

// record feeds a call's outcome to the breaker; epoch is failEpoch when
// the call started.
func (g *Guard) record(parent context.Context, probe bool, epoch int64, err error) {
	o := classify(parent, err)
	failed := o == failure
	if failed {
		g.failures.Add(1)
	}
	if !probe && BreakerState(g.state.Load()) == BreakerClosed {
		if o == inconclusive {
			return
		}
		if failed && !g.failEpoch.CompareAndSwap(epoch, epoch+1) {
			// Another failure was counted while this call was in flight:
			// the same incident (one batch, one stall), counted once.
			g.logFailure(err)
			return
		}
		calls, fails := g.count(failed)
		if !failed {
			if g.consecutive.Load() != 0 {
				g.consecutive.Store(0)
			}
			return
		}
		n := g.consecutive.Add(1)
		ratio := calls >= int64(g.cfg.MinRequests) && float64(fails) >= g.cfg.FailureRatio*float64(calls)
		if n < int64(g.cfg.Failures) && !ratio {
			g.logFailure(err)
			return
		}
		g.mu.Lock()
		if BreakerState(g.state.Load()) == BreakerClosed {
			g.open(err)
		}
		g.mu.Unlock()
		g.flush()
		return
	}
	if !probe {
		return // a call that started before the breaker opened
	}
	defer g.flush()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probing = false
	switch o {
	case failure:
		g.open(err)
	case success:
		g.resetCounts()
		g.transition(BreakerClosed, nil)
	}
	// inconclusive: stay half-open; the next call probes.
}

// count adds a call to the ratio window and returns the window's calls and
// failures so far.
func (g *Guard) count(failed bool) (calls, fails int64) {
	now := g.now().UnixNano()
	if start := g.winStart.Load(); now-start >= int64(g.cfg.Window) && g.winStart.CompareAndSwap(start, now) {
		g.winCalls.Store(0)
		g.winFails.Store(0)
	}
	calls = g.winCalls.Add(1)
	if failed {
		fails = g.winFails.Add(1)
	} else {
		fails = g.winFails.Load()
	}
	return calls, fails
}

func (g *Guard) resetCounts() {
	g.consecutive.Store(0)
	g.winCalls.Store(0)
	g.winFails.Store(0)
	g.winStart.Store(g.now().UnixNano())
}

// open moves the breaker to open on the failure err. g.mu must be held.
func (g *Guard) open(err error) {
	g.openedAt = g.now()
	g.resetCounts()
	g.transition(BreakerOpen, err)
}

// transition changes the state and queues the change for flush. A move
// from closed starts an outage, which err (the failure) started; a move to
// closed ends it. g.mu must be held.
func (g *Guard) transition(to BreakerState, err error) {
	from := BreakerState(g.state.Swap(int32(to)))
	if from == to {
		return
	}
	ev := transitionEvent{from: from, to: to}
	switch {
	case from == BreakerClosed:
		now := g.now()
		// The failure that opened the breaker is the outage's first.
		g.outage = outage{start: now, logged: now, failures: g.failures.Load(), rejected: g.rejected.Load(), fallbacks: g.fallbacks.Load()}
		if g.outage.failures > 0 {
			g.outage.failures--
		}
		ev.err = err
	case to == BreakerClosed:
		ev.counts = g.counts(g.now())
	}
	g.pending = append(g.pending, ev)
}

// flush logs and reports queued transitions, in order, outside g.mu, so
// that OnStateChange may call the Guard.
func (g *Guard) flush() {
	g.notifyMu.Lock()
	defer g.notifyMu.Unlock()
	g.mu.Lock()
	pending := g.pending
	g.pending = nil
	g.mu.Unlock()
	for _, ev := range pending {
		switch {
		case ev.from == BreakerClosed:
			g.log.Warn(msgOutageStarted, "cooldown", g.cfg.Cooldown, "err", ev.err)
		case ev.to == BreakerClosed:
			g.log.Info(msgOutageEnded, ev.counts.attrs()...)
		}
		if g.onState != nil {
			g.onState(ev.from, ev.to)
		}
	}
	// A minute or more since the outage's last line: say it lasts.
	g.mu.Lock()
	var still outageCounts
	down := BreakerState(g.state.Load()) != BreakerClosed
	if down {
		now := g.now()
		if down = now.Sub(g.outage.logged) >= outageLogEvery; down {
			g.outage.logged = now
			still = g.counts(now)
		}
	}
	g.mu.Unlock()
	if down {
		g.log.Warn(msgStillDown, still.attrs("breaker", BreakerState(g.state.Load()).String())...)
	}
}

// logFailure logs store failures while the breaker is closed at most once
// per interval, with the count since the last line; an outage's lines
// count the failures while it is open.
func (g *Guard) logFailure(err error) {
	n := g.unlogged.Add(1)
	now := g.now().UnixNano()
	last := g.lastLog.Load()
	if last != 0 && now-last < int64(g.logEvery) {
		return
	}
	if !g.lastLog.CompareAndSwap(last, now) {
		return
	}
	g.unlogged.Add(-n)
	g.log.Error(msgFailing, "failures", n, "breaker", BreakerState(g.state.Load()).String(), "err", err)
}

// call runs f against the store under the breaker and the deadline.
func (g *Guard) call(ctx context.Context, f func(context.Context) error) error {
	probe, err := g.admit()
	if err != nil {
		return err
	}
	epoch := g.failEpoch.Load()
	cctx := ctx
	if !g.noDeadline {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, g.timeout)
		defer cancel()
	}
	err = f(cctx)
	if err != nil && cctx.Err() != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
		// A store that reports its own error for a deadline still timed out.
		err = fmt.Errorf("%w: %w", err, context.DeadlineExceeded)
	}
	g.record(ctx, probe, epoch, err)
	return err
}

// invalid returns the error a store gives a request it refuses as invalid
// (an unusable limit, a cost outside what the limit allows:
// weir.Request.Check), or nil. The guard asks only while the breaker is
// not closed: an invalid request then gets its own error, as when the
// store answers, rather than the breaker's, and it never takes the
// half-open probe's place.
func invalid(reqs []weir.Request) error {
	for i := range reqs {
		if reqs[i].Mode == weir.ModeRelease || reqs[i].Mode == weir.ModeReset {
			continue
		}
		if err := reqs[i].Check(); err != nil {
			return err
		}
	}
	return nil
}

// closed reports whether the breaker is closed.
func (g *Guard) closed() bool { return BreakerState(g.state.Load()) == BreakerClosed }

// Take implements weir.Store. While the breaker is not closed, the
// request is checked first (an invalid one gets its own error).
func (g *Guard) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if !g.closed() {
		req := weir.Request{Key: key, Limit: l, N: n}
		if err := req.Check(); err != nil {
			return weir.Result{}, err
		}
	}
	var res weir.Result
	err := g.call(ctx, func(ctx context.Context) error {
		var err error
		res, err = g.store.Take(ctx, key, l, n)
		return err
	})
	return res, err
}

// Do implements weir.Store: the requests are checked (while the breaker
// is not closed) and go to the store through the breaker. A reset also
// resets the local fallback state.
func (g *Guard) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if len(reqs) == 1 && len(results) >= 1 && reqs[0].Mode == weir.ModeReset {
		var local [1]weir.Result
		_ = g.local.Do(ctx, reqs, local[:])
	}
	if !g.closed() {
		if err := invalid(reqs); err != nil {
			return err
		}
	}
	return g.call(ctx, func(ctx context.Context) error { return g.store.Do(ctx, reqs, results) })
}
