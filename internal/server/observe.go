package server

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/keys"
	"github.com/weir-dev/weir/internal/server/envoyrls"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/weirotel"
)

// topK is how many identities each rule's hot-key sketch monitors.
const topK = 64

// fallbackSeen remembers the last on_error fallback a decision used, and
// since when it has been deciding (with gaps under fallbackRecent).
type fallbackSeen struct {
	mode    string
	atMS    int64
	sinceMS int64
}

// observe is the policy observer: every rule decision of /v1/auth and
// /v1/check passes here, to the metrics, the per-second counters, the
// hot-key sketches and the penalty-box index. A decision the on_error
// fallback made counts by what it decided, with the fallback's name.
func (s *Server) observe(ctx context.Context, rr policy.RuleResult, lat time.Duration) {
	if rr.Skipped {
		return
	}
	if s.o.tracing != nil {
		weirotel.CheckFrom(ctx).Decision(rr.Rule, rr.Tier, rr.Result.Allowed && !rr.Denied, rr.Shadow, rr.Fallback, rr.Err)
	}
	failed := storeFailed(ctx, rr.Err)
	if !rr.Denied && rr.Result.Allowed && rr.Result.Granted == 0 {
		// A peek, or a rule that did not consume because another
		// rejected: no decision, though perhaps a failed store call.
		if rr.Err != nil {
			s.metrics.store(lat, failed)
		}
		return
	}
	now := s.now()
	result, outcome := classify(rr)
	if rr.Denied {
		lat = -1 // no store call was made
	}
	s.count(rr.Rule, result, outcome, rr.Fallback, rr.IsNearLimit(), now, lat, failed)
	if rr.Fallback != "" {
		s.noteFallback(rr.Fallback, now)
	}
	if rr.Identity == "" || rr.Result.Allowed || rr.Denied {
		return
	}
	if rr.Err == nil {
		s.tops.add(rr.Rule, rr.Identity)
	}
	if !rr.Shadow && !rr.Result.BlockedUntil.IsZero() && rr.Result.BlockedUntil.After(now) {
		s.blocked.record(rr.Rule, rr.Identity, rr.Result.BlockedUntil)
	}
}

// storeFailed reports whether err, a decision's store error, counts as a
// store failure: not a decision never sent (weir.ErrNotSent, such as one
// queued past its deadline behind others), nor one whose caller gave up
// (a client's deadline or cancel), nor a request refused as invalid. The
// guard's breaker agrees. An open breaker's refusal counts.
func storeFailed(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && errors.Is(err, weir.ErrStore) && !errors.Is(err, weir.ErrNotSent)
}

// noteFallback remembers that the fallback mode decided at now, for the
// snapshot's store.fallback.
func (s *Server) noteFallback(mode string, now time.Time) {
	ms := now.UnixMilli()
	f := s.lastFallbk.Load()
	if f != nil && f.mode == mode && ms-f.atMS <= 500 {
		return
	}
	since := ms
	if f != nil && f.mode == mode && ms-f.atMS < fallbackRecent.Milliseconds() {
		since = f.sinceMS
	}
	s.lastFallbk.Store(&fallbackSeen{mode, ms, since})
}

// classify names a rule result for the metrics and the counters: what was
// decided, by the store or by the fallback.
func classify(rr policy.RuleResult) (string, int) {
	switch {
	case rr.Denied:
		return resultDenied, outLimited
	case rr.Result.Allowed:
		return resultAllowed, outAllowed
	case rr.Shadow:
		return resultShadowLimited, outShadowLimited
	}
	return resultLimited, outLimited
}

// count records one decision everywhere it is counted. fallback names the
// on_error fallback that made it, "" when the store did; near says it was
// admitted near its limit (policy.NearLimit). lat < 0 means no store call
// was made; failed, that the store call failed.
func (s *Server) count(rule, result string, outcome int, fallback string, near bool, now time.Time, lat time.Duration, failed bool) {
	s.metrics.decision(rule, result)
	if fallback != "" {
		s.metrics.fallbackDecision(rule, fallback, result)
	}
	if near {
		s.metrics.nearLimit(rule)
	}
	if lat >= 0 {
		s.metrics.store(lat, failed)
	}
	s.stats.record(rule, now, outcome, fallback != "", near, lat)
}

// maxEnvoyInFlight bounds the store calls one Envoy call has under way at
// once, so that a call's descriptors cost a bounded number of goroutines
// and a bounded share of the store's connections.
const maxEnvoyInFlight = 8

// envoyDecider runs the Envoy service's store calls through the stack
// (deadline and circuit breaker) and, when the store fails, answers with
// the guard's fallback under the config's global on_error, as /v1/check
// and /v1/auth do, and says so in fallback.
func (s *Server) envoyDecider(ctx context.Context, reqs []weir.Request, res []weir.Result, fallback []string) error {
	// Descriptors are independent (as in envoyproxy/ratelimit). With
	// Redis, a request's descriptors are decided concurrently, at most
	// maxEnvoyInFlight at once, so that the calls under way share one
	// pipelined (or coalesced) round trip instead of one each. The memory
	// store never waits, so there they are decided in turn: a goroutine
	// would cost more than the decision.
	var one [1]envoyCall // on the stack: no goroutine sees calls
	calls := one[:]
	if workers := min(len(reqs), maxEnvoyInFlight); workers <= 1 || s.mem {
		if len(reqs) > 1 {
			calls = make([]envoyCall, len(reqs))
		}
		for i := range reqs {
			calls[i].decide(ctx, s.stack, reqs, res, i)
		}
	} else {
		shared := make([]envoyCall, len(reqs))
		var next atomic.Int64
		work := func() {
			for i := int(next.Add(1) - 1); i < len(reqs); i = int(next.Add(1) - 1) {
				shared[i].decide(ctx, s.stack, reqs, res, i)
			}
		}
		var wg sync.WaitGroup
		for range workers - 1 {
			wg.Go(work)
		}
		work()
		wg.Wait()
		calls = shared
	}
	var cfg *config.Config
	now := s.now()
	for i := range reqs {
		err := calls[i].err
		s.metrics.store(calls[i].lat, storeFailed(ctx, err))
		s.stats.observeStore(now, calls[i].lat)
		if err == nil {
			continue
		}
		if !errors.Is(err, weir.ErrStore) || ctx.Err() != nil {
			return err
		}
		p := s.holder.Load()
		if cfg == nil {
			cfg = p.Config()
		}
		mode := envoyOnError(cfg)
		if err := s.guard.Fallback(ctx, mode, reqs[i:i+1], res[i:i+1], p.Instances()); err != nil {
			return err
		}
		fallback[i] = mode
		s.noteFallback(mode, s.now())
	}
	return nil
}

// envoyCall is one store call of an Envoy call: its error and latency.
type envoyCall struct {
	err error
	lat time.Duration
}

// decide makes request i's store call through stack.
func (c *envoyCall) decide(ctx context.Context, stack weir.Store, reqs []weir.Request, res []weir.Result, i int) {
	start := time.Now()
	c.err = stack.Do(ctx, reqs[i:i+1], res[i:i+1])
	c.lat = time.Since(start)
}

// envoyOnError is the fallback of the Envoy service: the config's global
// on_error (store.on_error), local by default.
func envoyOnError(cfg *config.Config) string {
	if cfg.Store.OnError != "" {
		return cfg.Store.OnError
	}
	return config.OnErrorLocal
}

// envoyObserve counts the Envoy service's decisions. Its rule label is the
// descriptor path from the config ("domain.key_value.key"), never a value
// from the request. Envoy rules are near their limit by the config's global
// near_limit.
func (s *Server) envoyObserve(ctx context.Context, d envoyrls.Observation) {
	if s.o.tracing != nil && d.Outcome != envoyrls.NoLimit {
		weirotel.CheckFrom(ctx).Decision(d.Rule, "", d.Outcome != envoyrls.Limited,
			d.Outcome == envoyrls.ShadowLimited, d.Fallback, d.Err)
	}
	var result string
	var outcome int
	switch d.Outcome {
	case envoyrls.Allowed:
		result, outcome = resultAllowed, outAllowed
	case envoyrls.Limited:
		result, outcome = resultLimited, outLimited
	case envoyrls.ShadowLimited:
		result, outcome = resultShadowLimited, outShadowLimited
	case envoyrls.Failed:
		result, outcome = resultError, outErrors
	default:
		return // no rule, or unlimited: nothing was decided
	}
	if d.Hits == 0 && d.Outcome == envoyrls.Allowed {
		return // a check without counting
	}
	near := d.Outcome == envoyrls.Allowed && d.Hits > 0 && policy.NearLimit(d.Result, s.holder.Load().NearLimit())
	s.count(d.Rule, result, outcome, d.Fallback, near, s.now(), -1, false)
}

// topSet holds one TopK of limited identities per rule.
type topSet struct {
	mu sync.RWMutex
	k  int
	m  map[string]*TopK
}

func newTopSet(k int) *topSet { return &topSet{k: k, m: make(map[string]*TopK)} }

func (t *topSet) add(rule, identity string) { t.addN(rule, identity, 1) }

// addN adds w to identity's weight under rule.
func (t *topSet) addN(rule, identity string, w int64) {
	identity = keys.ShortIdentity(identity) // at most 64 bytes, or "~" and a hash
	t.mu.RLock()
	tk := t.m[rule]
	t.mu.RUnlock()
	if tk == nil {
		t.mu.Lock()
		if tk = t.m[rule]; tk == nil {
			tk = NewTopK(t.k)
			t.m[rule] = tk
		}
		t.mu.Unlock()
	}
	tk.Add(identity, w)
}

// all returns the n heaviest identities of every rule.
func (t *topSet) all(n int) map[string][]TopEntry {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make(map[string][]TopEntry, len(t.m))
	for rule, tk := range t.m {
		out[rule] = tk.Top(n)
	}
	return out
}

// retain drops the sketches of rules not in keep.
func (t *topSet) retain(keep map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for rule := range t.m {
		if !keep[rule] {
			delete(t.m, rule)
		}
	}
}

// mergeTops adds up several instances' top lists into one, heaviest first.
func mergeTops(lists ...map[string][]TopEntry) map[string][]TopEntry {
	sum := map[string]map[string]int64{}
	for _, l := range lists {
		for rule, es := range l {
			m := sum[rule]
			if m == nil {
				m = map[string]int64{}
				sum[rule] = m
			}
			for _, e := range es {
				m[e.Identity] += e.Count
			}
		}
	}
	out := make(map[string][]TopEntry, len(sum))
	for rule, m := range sum {
		es := make([]TopEntry, 0, len(m))
		for id, c := range m {
			es = append(es, TopEntry{Identity: id, Count: c})
		}
		sortEntries(es)
		out[rule] = es
	}
	return out
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
