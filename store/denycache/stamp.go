package denycache

import (
	"context"
	"fmt"

	"github.com/weir-dev/weir"
)

// TakeStamped implements weir.StampStore as Take does: a live cached
// denial answers (with no Stamp), and a miss asks the wrapped store for a
// dated take (when the wrapped store is a weir.StampStore; a plain Take, with no Stamp,
// when it dates none) and keeps its denial. So a reservation (Reserve,
// weir serve's /v1/reserve, a policy rule with a cost) is dated by the
// store's clock and still answered from memory while its key is denied.
func (s *Store) TakeStamped(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, weir.Stamp, error) {
	ss, dated := s.next.(weir.StampStore)
	next := func(ctx context.Context) (weir.Result, weir.Stamp, error) {
		if !dated {
			res, err := s.next.Take(ctx, key, l, n)
			return res, weir.Stamp{}, err
		}
		return ss.TakeStamped(ctx, key, l, n)
	}
	if n < 1 || !cacheable(l) || !s.live.Load() {
		return next(ctx)
	}
	lc := s.t.locate(key)
	sent := s.t.now()
	if r, ok := s.t.lookup(&lc, key, l, n, sent); ok {
		return r, weir.Stamp{}, nil
	}
	lc.sh.miss.Add(1)
	epoch := lc.sh.epoch.Load()
	res, st, err := next(ctx)
	if err == nil && !res.Allowed && res.RetryAfter > 0 && s.live.Load() {
		if maxCost, ok := keepable(l); ok {
			s.t.insert(&lc, key, l, n, maxCost, sent, epoch, &res)
		}
	}
	return res, st, err
}

// TakeAllStamped implements weir.StampAllStore as TakeAll does: a batch of
// one take is TakeStamped (a live cached denial answers it, with no Stamp,
// and a miss keeps its denial); a larger batch, which TakeAll never
// answers from memory, goes to the wrapped store's TakeAllStamped when the
// wrapped store is a weir.StampAllStore (TakeAll, with no Stamps, when it
// dates no batches).
func (s *Store) TakeAllStamped(ctx context.Context, reqs []weir.Request, results []weir.Result, stamps []weir.Stamp) error {
	if len(stamps) < len(reqs) {
		return fmt.Errorf("denycache: %d stamps for %d requests", len(stamps), len(reqs))
	}
	clear(stamps[:len(reqs)])
	sa, dated := s.multi.(weir.StampAllStore)
	switch {
	case !dated:
		return s.TakeAll(ctx, reqs, results)
	case len(reqs) != 1:
		return sa.TakeAllStamped(ctx, reqs, results, stamps)
	}
	r := &reqs[0]
	if r.Mode != weir.ModeTake || r.AtMost || r.Lease != "" || len(results) < 1 {
		return s.TakeAll(ctx, reqs, results)
	}
	res, st, err := s.TakeStamped(ctx, r.Key, r.Limit, r.N)
	if err == nil {
		results[0], stamps[0] = res, st
	}
	return err
}
