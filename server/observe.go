package server

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/server/envoyrls"
)

// topK is how many identities each rule's hot-key sketch monitors.
const topK = 64

// maxTopIdentity bounds the identities kept in the sketches, in bytes.
const maxTopIdentity = 256

// fallbackSeen remembers the last on_error fallback a decision used.
type fallbackSeen struct {
	mode string
	atMS int64
}

// observe is the policy observer: every rule decision of /v1/auth and
// /v1/check passes here, to the metrics, the per-second counters, the
// hot-key sketches and the penalty-box index.
func (s *Server) observe(ctx context.Context, rr policy.RuleResult, lat time.Duration) {
	if rr.Skipped {
		return
	}
	if rr.Err == nil && !rr.Denied && rr.Result.Allowed && rr.Result.Granted == 0 {
		return // a peek, or a rule that did not consume because another rejected
	}
	now := s.now()
	result, outcome := classify(rr)
	if rr.Denied {
		lat = -1 // no store call was made
	}
	// A caller that gave up (a client's deadline or cancel) says nothing
	// of the store: it is not a store error, as the guard's breaker agrees.
	s.count(rr.Rule, result, outcome, now, lat, rr.Err != nil && ctx.Err() == nil)
	if rr.Fallback != "" {
		ms := now.UnixMilli()
		if f := s.lastFallbk.Load(); f == nil || f.mode != rr.Fallback || ms-f.atMS > 500 {
			s.lastFallbk.Store(&fallbackSeen{rr.Fallback, ms})
		}
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

// classify names a rule result for the metrics and the counters.
func classify(rr policy.RuleResult) (string, int) {
	switch {
	case rr.Err != nil:
		return resultError, outErrors
	case rr.Denied:
		return resultDenied, outLimited
	case rr.Result.Allowed:
		return resultAllowed, outAllowed
	case rr.Shadow:
		return resultShadowLimited, outShadowLimited
	}
	return resultLimited, outLimited
}

// count records one decision everywhere it is counted. lat < 0 means no
// store call was made.
func (s *Server) count(rule, result string, outcome int, now time.Time, lat time.Duration, failed bool) {
	s.metrics.decision(rule, result)
	if lat >= 0 {
		s.metrics.store(lat, failed)
	}
	s.stats.record(rule, now, outcome, lat)
}

// envoyDecider runs the Envoy service's store calls through the guard
// (deadline and circuit breaker) and, when the store fails, applies the
// config's global on_error instead of failing the call.
func (s *Server) envoyDecider(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
	// Descriptors are independent (as in envoyproxy/ratelimit), so a
	// request's descriptors are decided concurrently: with Redis, rueidis
	// pipelines them into one round trip instead of one each.
	var one [1]error
	var oneLat [1]time.Duration
	errs, lats := one[:], oneLat[:]
	if len(reqs) > 1 {
		errs, lats = make([]error, len(reqs)), make([]time.Duration, len(reqs))
	}
	decide := func(i int) {
		start := time.Now()
		if s.guard.Multi() {
			errs[i] = s.guard.TakeAll(ctx, reqs[i:i+1], res[i:i+1])
		} else {
			res[i], errs[i] = s.guard.Take(ctx, reqs[i].Key, reqs[i].Limit, reqs[i].N)
		}
		lats[i] = time.Since(start)
	}
	if len(reqs) == 1 {
		decide(0)
	} else {
		var wg sync.WaitGroup
		for i := 1; i < len(reqs); i++ {
			wg.Go(func() { decide(i) })
		}
		decide(0)
		wg.Wait()
	}
	for i := range reqs {
		err := errs[i]
		s.metrics.store(lats[i], err != nil && ctx.Err() == nil) // a caller that gave up is no store error
		s.stats.observeStore(s.now(), lats[i])
		if err == nil {
			continue
		}
		if !errors.Is(err, weir.ErrStore) || ctx.Err() != nil {
			return err
		}
		if err := s.envoyFallback(ctx, reqs[i], &res[i]); err != nil {
			return err
		}
	}
	return nil
}

// envoyFallback decides one Envoy request while the store is failing.
func (s *Server) envoyFallback(ctx context.Context, req weir.Request, res *weir.Result) error {
	cfg := s.holder.Load().Config()
	mode := cfg.Store.OnError
	if mode == "" {
		mode = cfg.OnError
	}
	rate := req.Limit.Burst
	if rate == 0 {
		rate = req.Limit.Rate
	}
	ms := s.now().UnixMilli()
	if f := s.lastFallbk.Load(); f == nil || f.mode != mode || ms-f.atMS > 500 {
		s.lastFallbk.Store(&fallbackSeen{mode, ms})
	}
	switch mode {
	case policy.OnErrorAllow:
		*res = weir.Result{Allowed: true, Limit: rate, Remaining: rate}
		return nil
	case policy.OnErrorDeny:
		*res = weir.Result{Limit: rate, RetryAfter: time.Second, ResetAfter: time.Second}
		return nil
	}
	n := int64(max(cfg.Instances, 1))
	l := req.Limit
	l.Rate = (l.Rate + n - 1) / n
	if l.Burst > 0 {
		l.Burst = (l.Burst + n - 1) / n
	}
	local := req
	local.Limit = l
	var out [1]weir.Result
	if err := s.guard.Local().TakeAll(ctx, []weir.Request{local}, out[:]); err != nil {
		*res = weir.Result{Limit: l.Rate, RetryAfter: time.Second}
		return nil
	}
	*res = out[0]
	return nil
}

// envoyObserve counts the Envoy service's decisions. Its rule label is the
// descriptor path from the config ("domain.key_value.key"), never a value
// from the request.
func (s *Server) envoyObserve(_ context.Context, d envoyrls.Decision) {
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
	s.metrics.decision(d.Rule, result)
	s.stats.record(d.Rule, s.now(), outcome, -1)
}

// topSet holds one TopK of limited identities per rule.
type topSet struct {
	mu sync.RWMutex
	k  int
	m  map[string]*TopK
}

func newTopSet(k int) *topSet { return &topSet{k: k, m: make(map[string]*TopK)} }

func (t *topSet) add(rule, identity string) {
	if len(identity) > maxTopIdentity {
		identity = identity[:maxTopIdentity] + "…"
	}
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
	tk.Add(identity, 1)
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
