package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/localbudget"
	"github.com/weir-dev/weir/store/memstore"
)

// ErrUnknownRule is wrapped by CheckKey's error when no rule has the name.
var ErrUnknownRule = errors.New("policy: unknown rule")

// Policy is a compiled rule set over a store. It is immutable and safe for
// concurrent use; a reload builds a new Policy (see Holder).
type Policy struct {
	cfg      *config.Config
	c        *compiled
	guard    *guard.Guard // falls back (on_error) and reports the breaker
	store    weir.Store   // decides: the guard, or a stack that goes through it (WithGuard)
	observer func(context.Context, RuleResult, time.Duration)
	log      *slog.Logger
	now      func() time.Time
	infos    []RuleInfo
	leases   *localbudget.Table
	fleet    func() int // instances: auto's live count; nil: the floor
	// prot is the protect rules in force; Holder swaps it for one that
	// keeps the previous policy's rules (see inherit).
	prot atomic.Pointer[protectSet]
}

// An Option configures New.
type Option func(*options)

type options struct {
	observer func(context.Context, RuleResult, time.Duration)
	log      *slog.Logger
	now      func() time.Time
	guard    guard.Config
	g        *guard.Guard
	leases   *localbudget.Table
	fleet    func() int
}

// WithLocalBudgets sets the table of local budgets (rules with
// local_budget: N). Share one across reloads, as weir serve does, so that
// the budgets held and their counters survive a reload; without it New
// makes a table of its own.
func WithLocalBudgets(t *localbudget.Table) Option { return func(o *options) { o.leases = t } }

// WithInstances sets where instances: auto reads the fleet's size: f
// returns how many instances are up now (weir serve counts its fleet
// registry in Redis). The policy never uses fewer than instances_floor.
// Without instances: auto in the config, f is ignored.
func WithInstances(f func() int) Option { return func(o *options) { o.fleet = f } }

// WithObserver reports every decision: each RuleResult that Check or
// CheckKey produces (shadow, skipped and fallback ones included) with the
// time its store call took. httplimit and the server hook metrics and logs
// here. The function must be safe for concurrent use and must not block.
func WithObserver(f func(ctx context.Context, r RuleResult, latency time.Duration)) Option {
	return func(o *options) { o.observer = f }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithClock sets the clock of the breaker and the local fallback store,
// for tests. It applies only when New builds the Guard itself.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithGuardConfig adjusts the Guard that New builds when it is given a
// plain store; the config file's store.timeout and store.breaker fill the
// fields left zero.
func WithGuardConfig(g guard.Config) Option { return func(o *options) { o.guard = g } }

// WithGuard says that the store given to New is a stack that goes through
// g (weir serve's: a deny cache in front of g): the policy decides with
// the store and falls back, and reports the breaker, through g. Without
// it, New finds a *guard.Guard given as the store, or builds one.
func WithGuard(g *guard.Guard) Option { return func(o *options) { o.g = g } }

// New compiles cfg into a Policy over store.
//
// Pass a *guard.Guard as store to share the circuit breaker and the local
// fallback counters across reloads; any other store is wrapped in a new
// Guard configured from cfg.Store (without a deadline of its own over a
// *memstore.Store, or over a store whose Timeout method says its own
// deadline is no longer than the guard's). A nil store means a new
// memstore, which is only allowed when cfg.Store.Type is memory. An
// invalid cfg gives a *config.Error.
func New(cfg *config.Config, store weir.Store, opts ...Option) (*Policy, error) {
	if cfg == nil {
		cfg = &config.Config{}
	}
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.now == nil {
		o.now = time.Now
	}
	rep := &plain{}
	config.Check(cfg, rep)
	c := check(cfg, rep)
	if len(rep.problems) > 0 {
		return nil, &config.Error{Problems: rep.problems}
	}
	g, ok := o.g, o.g != nil
	if !ok {
		g, ok = store.(*guard.Guard)
	}
	if !ok {
		gc := o.guard
		switch st := store.(type) {
		case nil:
			if cfg.Store.Type == config.StoreRedis {
				return nil, errors.New("policy: store.type is redis, so New needs the Redis store (redisstore.New); it was given none")
			}
			var mo []memstore.Option
			if cfg.Store.MaxKeys > 0 {
				mo = append(mo, memstore.WithMaxKeys(cfg.Store.MaxKeys))
			}
			store, gc.NoDeadline = memstore.New(mo...), true
		case *memstore.Store:
			gc.NoDeadline = true // it never waits
		case interface{ Timeout() time.Duration }:
			if gc.StoreTimeout == 0 {
				// The store's own deadline per call (redisstore.Store).
				gc.StoreTimeout = st.Timeout()
			}
		}
		if gc.Timeout == 0 {
			gc.Timeout = cfg.Store.Timeout
		}
		if gc.Breaker == (guard.BreakerConfig{}) {
			gc.Breaker = cfg.Store.Breaker
		}
		if gc.Logger == nil {
			gc.Logger = o.log
		}
		if gc.Now == nil {
			gc.Now = o.now
		}
		g = guard.New(store, gc)
	}
	if o.g == nil {
		store = g
	}
	set, err := newProtectSet(c, &o)
	if err != nil {
		return nil, err
	}
	p := &Policy{cfg: cfg, c: c, guard: g, store: store, observer: o.observer, log: o.log, now: o.now, leases: o.leases, fleet: o.fleet}
	if p.leases == nil {
		p.leases = localbudget.New(localbudget.Config{Now: o.now})
	}
	p.prot.Store(set)
	for _, r := range c.rules {
		p.infos = append(p.infos, r.info)
	}
	return p, nil
}

// Instances returns the instance count the policy divides by: the
// static instances, or under instances: auto the fleet's live count, never
// below instances_floor.
func (p *Policy) Instances() int {
	if p.c.auto && p.fleet != nil {
		return max(p.fleet(), p.c.instances)
	}
	return p.c.instances
}

// LocalBudgets returns the table of local budgets the policy spends from.
func (p *Policy) LocalBudgets() *localbudget.Table { return p.leases }

// Config returns the config the policy was built from. It must not be
// modified.
func (p *Policy) Config() *config.Config { return p.cfg }

// Guard returns the guard around the policy's store: its breaker state and
// failure counters are what metrics report.
func (p *Policy) Guard() *guard.Guard { return p.guard }

// Store returns the store behind the policy's guard.
func (p *Policy) Store() weir.Store { return p.guard.Store() }

// Rules describes the rules in force, in evaluation order.
func (p *Policy) Rules() []RuleInfo {
	out := make([]RuleInfo, len(p.infos))
	copy(out, p.infos)
	return out
}

// Limit returns the limit of rule's tier; "" is the default tier.
func (p *Policy) Limit(rule, tier string) (weir.Limit, error) {
	r, err := p.rule(rule)
	if err != nil {
		return weir.Limit{}, err
	}
	return r.pick(tier).limit, nil
}

func (p *Policy) rule(name string) (*rule, error) {
	r := p.c.byName[name]
	if r == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownRule, name)
	}
	return r, nil
}

// pick returns the tier named name, or the default.
func (r *rule) pick(name string) *tier {
	if t := r.tierNamed[name]; t != nil {
		return t
	}
	return r.tiers[0]
}
