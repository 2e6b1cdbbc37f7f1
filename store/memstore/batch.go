package memstore

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// Do implements weir.Store. A batch of several takes is decided under
// the locks of all their shards, taken in index order so batches cannot
// deadlock; its keys must be distinct. Every admitted take of N > 0 is
// dated by the one clock reading the batch is decided at (Result.At).
func (s *Store) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if len(results) < len(reqs) {
		return fmt.Errorf("memstore: %d results for %d requests", len(results), len(reqs))
	}
	if len(reqs) != 1 {
		return s.takeBatch(reqs, results)
	}
	r := &reqs[0]
	var err error
	switch {
	case r.Mode == weir.ModeRelease:
		results[0], err = weir.Result{}, s.release(r.Key, r.Limit, r.Lease)
		return err
	case r.Mode == weir.ModeReset:
		results[0], err = weir.Result{}, s.reset(r.Key, r.Limit)
		return err
	case r.Mode == weir.ModeRefund && !r.Stamp.IsZero():
		results[0], err = s.settle(r)
		return err
	}
	err = s.take(r, &r.Limit, r.Mode == weir.ModeTake && r.Lease == "", &results[0])
	if err != nil {
		results[0] = weir.Result{}
	}
	return err
}

// takeBatch decides a batch of several takes, all or nothing, and dates
// the admitted ones.
func (s *Store) takeBatch(reqs []weir.Request, results []weir.Result) error {
	for i := range reqs {
		if one(&reqs[i]) {
			return fmt.Errorf("%w: a %s decides one request at a time, not a batch of %d", weir.ErrUnsupported, reqs[i].Mode, len(reqs))
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	// Batches are small (one request per matched rule): keep them on the stack.
	var itemsBuf [batchScratch]batchItem
	var idxBuf [batchScratch]int
	items := itemsBuf[:0]
	if len(reqs) > len(itemsBuf) {
		items = make([]batchItem, 0, len(reqs))
	}
	items = items[:len(reqs)]
	idx, err := s.planBatch(reqs, items, idxBuf[:0])
	if err != nil {
		return err
	}
	sc := getScratch(len(reqs))
	defer putScratch(sc)
	s.lockShards(idx)
	defer s.unlockShards(idx)
	now := s.micros()
	s.makeRoomForBatch(reqs, items, idx, now)
	if err := s.resolveBatch(reqs, items, sc); err != nil {
		return err
	}
	s.decideBatch(reqs, items, results, now)
	weir.StampAdmitted(reqs, results, now)
	return nil
}

// batchScratch is the number of requests a batch decides without
// allocating.
const batchScratch = 8

// scratchStates are the States a batch's packed keys are decided on.
// Between batches only their packed fields are ever non-zero.
type scratchStates []algorithm.State

var scratchPool = sync.Pool{New: func() any { s := make(scratchStates, batchScratch); return &s }}

func getScratch(n int) *scratchStates {
	if n > batchScratch {
		s := make(scratchStates, n)
		return &s
	}
	return scratchPool.Get().(*scratchStates)
}

func putScratch(s *scratchStates) {
	if len(*s) == batchScratch {
		scratchPool.Put(s)
	}
}

// batchItem is one request of a TakeAll batch being decided.
type batchItem struct {
	tag   uint32
	kind  algorithm.Kind
	sh    *shard
	c     *compiled
	st    *algorithm.State // the slot's own State, or a scratch loaded from it
	fresh bool
	mode  algorithm.Mode
	n     int64
}

// planBatch checks each request's key and algorithm, refuses a key that
// appears twice under one algorithm, and fills each item's hash, shard and
// mode. It returns the batch's shard indexes, sorted and distinct, appended
// to idx.
func (s *Store) planBatch(reqs []weir.Request, items []batchItem, idx []int) ([]int, error) {
	for i, r := range reqs {
		k, err := kindOf(r.Limit)
		if err != nil {
			return nil, err
		}
		for j := 0; j < i; j++ {
			if reqs[j].Key == r.Key && items[j].kind == k {
				return nil, fmt.Errorf("memstore: key %q appears twice in one batch", r.Key)
			}
		}
		si, tag := s.hashIndex(r.Key)
		items[i] = batchItem{tag: tag, kind: k, sh: &s.shards[si]}
		items[i].mode = r.AlgorithmMode()
		idx = append(idx, si)
	}
	slices.Sort(idx)
	return slices.Compact(idx), nil
}

// lockShards locks the shards idx names, in its (ascending) order.
func (s *Store) lockShards(idx []int) {
	for _, si := range idx {
		s.shards[si].mu.Lock()
	}
}

// unlockShards unlocks the shards lockShards locked.
func (s *Store) unlockShards(idx []int) {
	for _, si := range idx {
		s.shards[si].mu.Unlock()
	}
}

// makeRoomForBatch sweeps before any slot of the batch is resolved: a
// sweep run while saving one member could otherwise drop another member's
// (expired) state after it was looked up, losing that member's new state.
// Each shard needs room for the batch's keys it does not hold yet, and no
// sweep or eviction may drop a key of the batch, which would make it new
// after its room was counted.
func (s *Store) makeRoomForBatch(reqs []weir.Request, items []batchItem, idx []int, now int64) {
	inBatch := func(k string) bool {
		for i := range reqs {
			if reqs[i].Key == k {
				return true
			}
		}
		return false
	}
	for _, si := range idx {
		sh := &s.shards[si]
		need := 0
		for i := range items {
			if items[i].sh != sh || sh.findKey(reqs[i].Key, items[i].tag) >= 0 {
				continue
			}
			first := true // a key new under two algorithms is one key
			for j := 0; j < i; j++ {
				first = first && reqs[j].Key != reqs[i].Key
			}
			if first {
				need++
			}
		}
		if need > 0 {
			s.makeRoom(sh, now, need, inBatch)
		}
	}
}

// resolveBatch finds or creates each item's state and fixes the cost it
// asks for, refusing a cost its limit can never admit.
func (s *Store) resolveBatch(reqs []weir.Request, items []batchItem, sc *scratchStates) error {
	for i := range reqs {
		r := &reqs[i]
		it := &items[i]
		l := &r.Limit
		if o := s.ovrs.Load(); o != nil {
			shi, _ := s.hashIndex(r.Key)
			if ol := s.overridden(o, shi, r.Key, l); ol != l {
				// The caller's limit first, as for a single take.
				if err := r.Check(); err != nil {
					return err
				}
				l = ol
			}
		}
		si, c, err := s.resolve(it.sh, r.Key, it.tag, l)
		if err != nil {
			return err
		}
		if err := r.CheckWith(&c.params); err != nil {
			return err
		}
		it.n = r.N
		if r.Mode == weir.ModeAtMost {
			it.n = min(r.N, c.params.MaxCost())
		}
		it.c, it.fresh = c, si < 0
		it.st = it.sh.open(si, c, &(*sc)[i])
	}
	return nil
}

// decideBatch decides the batch all or nothing: when every item would be
// admitted, each one takes its cost; otherwise none does, and only the
// items that sank the batch record their rejection.
func (s *Store) decideBatch(reqs []weir.Request, items []batchItem, results []weir.Result, now int64) {
	all := true
	for i := range reqs {
		d := algorithm.Check(&items[i].c.params, items[i].st, now, items[i].n, items[i].mode)
		results[i] = weir.ResultOf(d)
		all = all && d.Allowed
	}
	for i, r := range reqs {
		it := &items[i]
		var d algorithm.Outcome
		save := true
		switch {
		case all:
			d = algorithm.Take(&it.c.params, it.st, now, it.n, it.mode)
			if d.Granted > 0 && r.Lease != "" {
				algorithm.SetLeaseID(it.st, r.Lease)
			}
			results[i] = weir.ResultOf(d)
		case !results[i].Allowed:
			// The request that sank the batch: Take consumes nothing
			// but starts its penalty box.
			d = algorithm.Take(&it.c.params, it.st, now, it.n, it.mode)
			results[i] = weir.ResultOf(d)
		default:
			results[i].Granted = 0
			results[i].Delay = 0
			save = false
		}
		if e := s.evts.Load(); e != nil && save {
			s.fire(e, it.sh, r.Key, it.n, it.c, &d, now)
		}
		if it.fresh {
			if !save {
				*it.st = algorithm.State{}
				continue
			}
			s.add(it.sh, r.Key, it.tag, it.c, it.st, now, d.TTL, true)
			continue
		}
		// The slot is found again: a new key of the batch may have grown
		// the table since it was resolved.
		sl := &it.sh.slots[it.sh.findKind(r.Key, it.tag, it.kind)]
		keep(sl, it.st)
		if save {
			sl.expires = now + d.TTL
		}
	}
}

// one reports whether r must be decided alone: every mode but a take
// (weir.ModeTake, weir.ModeAtMost) must.
func one(r *weir.Request) bool { return r.Mode != weir.ModeTake && r.Mode != weir.ModeAtMost }
