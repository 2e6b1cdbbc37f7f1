package protect

import (
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
	shadow bool // admitted only because the rule is in shadow mode
}

// Acquire admits a request of priority p, or refuses it with a
// *Rejection. A rule in shadow mode admits every request, counting the
// ones it would have refused.
func (r *Rule) Acquire(p Priority) (Ticket, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if rej := r.admit(now, p); rej != nil {
		if !r.cfg.Shadow {
			return Ticket{}, rej
		}
		r.lim.inflight++
		r.stats.admitted[p]++
		return Ticket{r: r, start: now, before: r.lim.inflight - 1, shadow: true}, nil
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
	r.lim.inflight++
	r.stats.admitted[p]++
	return Ticket{r: r, start: now, before: r.lim.inflight - 1, probe: probe, shadow: !ok}, nil
}

// admit applies the concurrency limit and the CPU gate, counting a shed.
func (r *Rule) admit(now time.Time, p Priority) *Rejection {
	n := r.lim.current()
	if g := r.cpu.limit(now); g > 0 && (n == 0 || g < n) {
		n = g
	}
	if n == 0 || r.lim.inflight < threshold(n, r.cfg.Reserve, p) {
		return nil
	}
	r.stats.shed[p]++
	return &Rejection{Rule: r.cfg.Name, Reason: ReasonOverloaded, Priority: p, RetryAfter: time.Second}
}

// Done ends an admitted request: failed says it failed (a 5xx, a panic,
// a transport error). Its latency, from Acquire to Done on the rule's
// clock, feeds the adaptive limit and the breaker.
func (t *Ticket) Done(failed bool) {
	r := t.r
	if r == nil {
		return
	}
	t.r = nil
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	rtt := now.Sub(t.start)
	r.lim.inflight--
	if failed {
		r.stats.failed++
	}
	if r.br != nil && !t.shadow {
		if r.br.cfg.SlowRatio > 0 && rtt > r.br.cfg.SlowCall {
			r.stats.slow++
		}
		r.br.record(now, t.probe, rtt, failed)
	}
	r.lim.sample(now, rtt, t.before)
	r.cpu.sample(now, rtt)
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
