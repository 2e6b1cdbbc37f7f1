package denycache

import (
	"context"

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
