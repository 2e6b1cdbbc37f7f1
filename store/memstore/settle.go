package memstore

import (
	"context"
	"fmt"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// TakeStamped implements weir.StampStore: Take, and when it admits, the
// take's Stamp by the store's clock.
func (s *Store) TakeStamped(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, weir.Stamp, error) {
	res, now, err := s.dated(key, &l, n, algorithm.Exact, nil)
	if err != nil || !res.Allowed {
		return res, weir.Stamp{}, err
	}
	return res, weir.Stamp{At: now, Estimate: n, Remaining: res.Remaining}, nil
}

// TakeAllStamped implements weir.StampAllStore: TakeAll, with each
// admitted take's Stamp by the one clock reading the batch is decided at.
func (s *Store) TakeAllStamped(ctx context.Context, reqs []weir.Request, results []weir.Result, stamps []weir.Stamp) error {
	switch {
	case len(results) < len(reqs):
		return fmt.Errorf("memstore: %d results for %d requests", len(results), len(reqs))
	case len(stamps) < len(reqs):
		return fmt.Errorf("memstore: %d stamps for %d requests", len(stamps), len(reqs))
	}
	clear(stamps[:len(reqs)])
	if len(reqs) > 1 {
		return s.takeBatch(reqs, results, stamps)
	}
	if len(reqs) == 0 {
		return nil
	}
	r := &reqs[0]
	if r.Mode != weir.ModeTake || r.AtMost || r.Lease != "" {
		return s.TakeAll(ctx, reqs, results)
	}
	res, now, err := s.dated(r.Key, &r.Limit, r.N, algorithm.Exact, nil)
	if err != nil {
		return err
	}
	results[0] = res
	weir.StampAdmitted(reqs, results, stamps, now)
	return nil
}

// dated is take for the two decisions that need the clock reading they
// were made at or a take's time: a stamped take (t nil) and a
// settlement's refund (mode algorithm.Settle, t the take). It returns
// the result and the clock reading. (take stays the hot path's own.)
func (s *Store) dated(key string, l *weir.Limit, n int64, mode algorithm.Mode, t *algorithm.Taken) (weir.Result, int64, error) {
	sh, tag := s.hash(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, c, err := s.resolve(sh, key, tag, l)
	if err != nil {
		return weir.Result{}, 0, err
	}
	maxCost := c.params.MaxCost()
	if mode >= algorithm.Debit {
		if err := weir.CheckDebt(key, n, &c.params, mode); err != nil {
			return weir.Result{}, 0, err
		}
		maxCost = algorithm.MaxDebt
	}
	if n < 0 || n > maxCost {
		return weir.Result{}, 0, weir.CheckCost(key, n, maxCost)
	}
	now := s.micros()
	st := sh.open(i, c, &sh.scratch)
	var d algorithm.Decision
	if mode == algorithm.Settle && t != nil && n > 0 {
		d = algorithm.SettleTake(&c.params, st, now, n, *t)
	} else {
		d = algorithm.Take(&c.params, st, now, n, mode)
	}
	if i >= 0 {
		sl := &sh.slots[i]
		keep(sl, st)
		sl.expires = now + d.TTL
	} else {
		s.add(sh, key, tag, c, st, now, d.TTL, false)
	}
	return weir.ResultOf(d), now, nil
}

// settle decides a one-request batch that refunds with a Stamp.
func (s *Store) settle(r *weir.Request) (weir.Result, error) {
	if err := weir.CheckStamp(r.Stamp, r.N); err != nil {
		return weir.Result{}, err
	}
	t := r.Stamp.Taken()
	res, _, err := s.dated(r.Key, &r.Limit, r.N, algorithm.Settle, &t)
	return res, err
}

var (
	_ weir.StampStore    = (*Store)(nil)
	_ weir.StampAllStore = (*Store)(nil)
)
