package memstore

import (
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// dated is take for the two decisions that need the clock reading they
// were made at or a take's time: a stamped take (t nil) and a
// settlement's refund (mode algorithm.Settle, t the take). It returns
// the result and the clock reading. (take stays the hot path's own.)
func (s *Store) dated(key string, l *weir.Limit, n int64, mode algorithm.Mode, t *algorithm.Taken) (weir.Result, int64, error) {
	si, tag := s.hashIndex(key)
	sh := &s.shards[si]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if o := s.ovrs.Load(); o != nil {
		l = s.overridden(o, si, key, l)
	}
	i, c, err := s.resolve(sh, key, tag, l)
	if err != nil {
		return weir.Result{}, 0, err
	}
	req := weir.Request{Key: key, N: n}
	if mode == algorithm.Settle {
		req.Mode, req.Stamp = weir.ModeRefund, weir.Stamp{At: t.At, Estimate: t.Cost, Remaining: t.Remaining}
	}
	if err := req.CheckWith(&c.params); err != nil {
		return weir.Result{}, 0, err
	}
	now := s.micros()
	st := sh.open(i, c, &sh.scratch)
	var d algorithm.Outcome
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

// settle decides a request that refunds with a Stamp.
func (s *Store) settle(r *weir.Request) (weir.Result, error) {
	t := algorithm.Taken{At: r.Stamp.At, Cost: r.Stamp.Estimate, Remaining: r.Stamp.Remaining}
	res, _, err := s.dated(r.Key, &r.Limit, r.N, algorithm.Settle, &t)
	return res, err
}
