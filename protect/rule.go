package protect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Reasons of a Rejection.
const (
	ReasonOverloaded  = "overloaded"
	ReasonCircuitOpen = "circuit_open"
)

// ErrOverloaded and ErrCircuitOpen are what a *Rejection matches with
// errors.Is.
var (
	ErrOverloaded  = errors.New("protect: overloaded")
	ErrCircuitOpen = errors.New("protect: circuit open")
)

// Rejection is the error of a request a rule turned away.
type Rejection struct {
	Rule     string // the rule's name
	Reason   string // ReasonOverloaded or ReasonCircuitOpen
	Priority Priority
	// RetryAfter is when a retry may succeed: when the breaker will let a
	// probe through, or a second while overloaded.
	RetryAfter time.Duration
}

// Error names the rule and the reason.
func (e *Rejection) Error() string {
	return fmt.Sprintf("protect: %s: %s", e.Rule, strings.ReplaceAll(e.Reason, "_", " "))
}

// Is matches ErrOverloaded or ErrCircuitOpen.
func (e *Rejection) Is(target error) bool {
	return target == ErrOverloaded && e.Reason == ReasonOverloaded ||
		target == ErrCircuitOpen && e.Reason == ReasonCircuitOpen
}

// Rule is a protect rule in force: a concurrency limit, a breaker or both.
// It is safe for concurrent use.
type Rule struct {
	mu    sync.Mutex
	cfg   Config
	now   func() time.Time
	lim   limiter
	br    *breaker
	cpu   cpuGate
	stats counters
	// waiters are critical requests waiting for a slot, oldest first.
	waiters []*waiter
}

// counters are a rule's running totals.
type counters struct {
	admitted, shed [NumPriorities]uint64
	circuitOpen    uint64
	failed, slow   uint64
}

// New returns the rule cfg describes, or an error naming its first
// problem.
func New(cfg Config) (*Rule, error) {
	r := &Rule{}
	if err := r.Reconfigure(cfg); err != nil {
		return nil, err
	}
	return r, nil
}

// Reconfigure puts cfg in force without forgetting the requests in flight:
// they are still counted against the limit, and release their slots when
// done. An adaptive limit that stays adaptive keeps what it learned; a
// breaker whose config is unchanged keeps its state. On error nothing
// changes.
func (r *Rule) Reconfigure(cfg Config) error {
	if ps := cfg.Problems(); len(ps) > 0 {
		return fmt.Errorf("protect: rule %q: %s: %s", cfg.Name, ps[0].Field, ps[0].Message)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.CPU == nil {
		cfg.CPU = defaultCPU
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.now = cfg.Now
	now := r.now()
	r.lim.configure(&cfg, now)
	switch {
	case cfg.Breaker == nil:
		r.br = nil
	case r.br == nil || r.br.cfg != cfg.Breaker.withDefaults():
		r.br = newBreaker(*cfg.Breaker)
	}
	r.cpu.max, r.cpu.read = cfg.MaxCPU, cfg.CPU
	r.cfg = cfg
	r.handOver(now) // a higher limit frees slots for waiting requests
	return nil
}

// Name returns the rule's name.
func (r *Rule) Name() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg.Name
}

// Ticket is an admitted request. Exactly one of Done or Cancel must be
// called on it, once.
type Ticket struct {
	r      *Rule
	start  time.Time
	before int // in flight when it was admitted
	probe  bool
	// unbroken: admitted past an open breaker only because the rule is in
	// shadow mode; its outcome does not count.
	unbroken bool
}

// Acquire admits a request of priority p, or refuses it with a
// *Rejection. A rule in shadow mode admits every request, counting the
// ones it would have refused. Acquire never waits; see Wait.
func (r *Rule) Acquire(p Priority) (Ticket, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acquire(r.now(), p, true)
}

// acquire is Acquire with r.mu held; countShed says whether a refusal by
// the limit counts as a shed (not when the request will wait).
func (r *Rule) acquire(now time.Time, p Priority, countShed bool) (Ticket, error) {
	rej := r.admit(now, p, countShed)
	if rej != nil && !r.cfg.Shadow {
		return Ticket{}, rej
	}
	ok, probe, retry := true, false, time.Duration(0)
	if r.br != nil {
		ok, probe, retry = r.br.allow(now)
	}
	if !ok {
		r.stats.circuitOpen++
		if !r.cfg.Shadow {
			return Ticket{}, &Rejection{Rule: r.cfg.Name, Reason: ReasonCircuitOpen, Priority: p, RetryAfter: retry}
		}
	}
	// In shadow mode a request refused by the limit still passes the
	// breaker, which counts its outcome; one the breaker refused does not.
	r.lim.inflight++
	r.stats.admitted[p]++
	return Ticket{r: r, start: now, before: r.lim.inflight - 1, probe: probe, unbroken: !ok}, nil
}

// waiter is a critical request waiting for a slot.
type waiter struct {
	granted func(Ticket, error)
	done    bool
}

// Wait is Acquire, except that a critical request the concurrency limit
// refuses waits for a slot, up to MaxWait or until ctx ends: the next slot
// freed goes to the critical request that has waited longest, before any
// other request can take it. Other priorities never wait.
func (r *Rule) Wait(ctx context.Context, p Priority) (Ticket, error) {
	type grant struct {
		t   Ticket
		err error
	}
	ch := make(chan grant, 1)
	t, cancel, bound, err := r.enqueue(p, func(t Ticket, err error) { ch <- grant{t, err} })
	if cancel == nil {
		return t, err
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case g := <-ch:
		return g.t, g.err
	case <-timer.C:
	case <-ctx.Done():
	}
	if cancel() {
		return Ticket{}, &Rejection{Rule: r.Name(), Reason: ReasonOverloaded, Priority: p, RetryAfter: time.Second}
	}
	g := <-ch
	return g.t, g.err
}

// MaxWait is how long a critical request that finds the limit full may
// wait for a slot now: Config.MaxWait when set; under an adaptive limit
// without it, the unloaded latency the limit has measured (0 until it has
// one); otherwise 0, no wait.
func (r *Rule) MaxWait() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxWait()
}

// maxWait is MaxWait with r.mu held.
func (r *Rule) maxWait() time.Duration {
	switch {
	case r.cfg.MaxWait > 0:
		return r.cfg.MaxWait
	case r.lim.adaptive:
		return r.lim.baseRTT
	}
	return 0
}

// Enqueue is Wait for event loops and simulations, which cannot block: it
// admits or refuses the request at once, as Acquire, unless it is a
// critical request refused by the concurrency limit while MaxWait is
// positive and fewer critical requests wait than the limit in force. Then
// it queues the request and returns a cancel function; when a slot comes
// free, granted is called with the ticket (or a circuit_open rejection),
// under the rule's lock: it must not call the rule. The caller calls
// cancel when MaxWait (as it stood at Enqueue) has passed: cancel
// withdraws the request, counts it as shed and reports true, or reports
// false and changes nothing if granted was called already.
func (r *Rule) Enqueue(p Priority, granted func(Ticket, error)) (t Ticket, cancel func() bool, err error) {
	t, cancel, _, err = r.enqueue(p, granted)
	return t, cancel, err
}

// enqueue is Enqueue, also returning the wait's bound.
func (r *Rule) enqueue(p Priority, granted func(Ticket, error)) (t Ticket, cancel func() bool, bound time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if p == Critical && !r.cfg.Shadow {
		bound = r.maxWait()
	}
	// The queue holds at most as many requests as the limit admits at
	// once: the ones beyond could not start within about one latency.
	wait := bound > 0 && len(r.waiters) < max(r.effectiveLimit(now, Critical), 1)
	t, err = r.acquire(now, p, !wait)
	var rej *Rejection
	if err == nil || !wait || !errors.As(err, &rej) || rej.Reason != ReasonOverloaded {
		return t, nil, 0, err
	}
	w := &waiter{granted: granted}
	r.waiters = append(r.waiters, w)
	return Ticket{}, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		if w.done {
			return false
		}
		w.done = true
		r.stats.shed[p]++
		for i, x := range r.waiters {
			if x == w {
				r.waiters = append(r.waiters[:i], r.waiters[i+1:]...)
				break
			}
		}
		return true
	}, bound, nil
}

// handOver gives freed slots to waiting critical requests, oldest first.
// r.mu is held.
func (r *Rule) handOver(now time.Time) {
	for len(r.waiters) > 0 {
		if n := r.effectiveLimit(now, Critical); n != 0 && r.lim.inflight >= threshold(n, r.cfg.Reserve, Critical) {
			return
		}
		w := r.waiters[0]
		r.waiters = r.waiters[1:]
		w.done = true
		w.granted(r.acquire(now, Critical, false))
	}
}

// admit applies the concurrency limit and the CPU gate, counting a shed.
func (r *Rule) admit(now time.Time, p Priority, countShed bool) *Rejection {
	n := r.effectiveLimit(now, p)
	if n == 0 || r.lim.inflight < threshold(n, r.cfg.Reserve, p) {
		return nil
	}
	if countShed {
		r.stats.shed[p]++
	}
	return &Rejection{Rule: r.cfg.Name, Reason: ReasonOverloaded, Priority: p, RetryAfter: time.Second}
}

// effectiveLimit is the concurrency limit for priority p, or the CPU
// gate's when lower; 0 for none. A probe of the adaptive limit does not
// lower it for critical requests.
func (r *Rule) effectiveLimit(now time.Time, p Priority) int {
	n := r.lim.current()
	if p == Critical && r.lim.adaptive {
		n = int(r.lim.limit)
	}
	if g := r.cpu.limit(now); g > 0 && (n == 0 || g < n) {
		n = g
	}
	return n
}

// Done ends an admitted request: failed says it failed (a 5xx, a panic,
// a transport error). Its latency, from Acquire to Done on the rule's
// clock, feeds the adaptive limit and the breaker.
func (t *Ticket) Done(failed bool) { t.DoneWaited(failed, 0) }

// DoneWaited is Done for a request that spent client of its latency
// blocked on its client (reading a body the client trickles, writing to a
// client that reads slowly): only the rest, the time the handler itself
// took, feeds the adaptive limit and the breaker, so that slow clients
// cannot make a healthy route look slow. Track measures client.
func (t *Ticket) DoneWaited(failed bool, client time.Duration) {
	r := t.r
	if r == nil {
		return
	}
	t.r = nil
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	rtt := max(now.Sub(t.start)-client, 0)
	r.lim.inflight--
	if failed {
		r.stats.failed++
	}
	if r.br != nil && !t.unbroken {
		if r.br.cfg.SlowRatio > 0 && rtt > r.br.cfg.SlowCall {
			r.stats.slow++
		}
		r.br.record(now, t.probe, rtt, failed)
	}
	r.lim.sample(now, rtt, t.before)
	r.cpu.sample(now, rtt)
	r.handOver(now)
}

// Cancel gives back an admitted request's slot without counting an
// outcome: for a request that another rule turned away before it ran.
func (t *Ticket) Cancel() {
	r := t.r
	if r == nil {
		return
	}
	t.r = nil
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lim.inflight--
	if r.br != nil {
		r.br.cancel(t.probe)
	}
	r.handOver(r.now())
}

// Stats is a snapshot of a rule, for metrics and the dashboard.
type Stats struct {
	Name     string
	Adaptive bool
	Shadow   bool
	// Limit is the concurrency limit in force (the adaptive one as it
	// stands), 0 for none; InFlight is the requests admitted and not done.
	Limit, InFlight int
	// BaseRTT is the adaptive limit's unloaded latency, 0 until measured.
	BaseRTT time.Duration
	// Admitted and Shed count requests by priority. In shadow mode, Shed
	// counts the requests that would have been shed, which were admitted.
	Admitted, Shed [NumPriorities]uint64
	// CircuitOpen counts requests the breaker refused (or, in shadow mode,
	// would have refused).
	CircuitOpen uint64
	// Failed and Slow count outcomes: failures, and calls slower than the
	// breaker's slow_call.
	Failed, Slow uint64
	// Breaker is false when the rule has none; State and Transitions
	// (entries into each state) are then zero.
	Breaker     bool
	State       State
	Transitions [NumStates]uint64
}

// Stats returns a snapshot of r.
func (r *Rule) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{
		Name: r.cfg.Name, Adaptive: r.lim.adaptive, Shadow: r.cfg.Shadow,
		Limit: r.lim.current(), InFlight: r.lim.inflight, BaseRTT: r.lim.baseRTT,
		Admitted: r.stats.admitted, Shed: r.stats.shed, CircuitOpen: r.stats.circuitOpen,
		Failed: r.stats.failed, Slow: r.stats.slow,
	}
	if r.br != nil {
		s.Breaker, s.State, s.Transitions = true, r.br.state, r.br.transitions
	}
	return s
}
