package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/events"
)

// item is one request of a batch, resolved.
type item struct {
	req  *weir.Request
	c    *compiled
	k    keyNames
	id   string
	mode algorithm.Mode
	n    int64 // the cost asked, capped at the limit's maximum for ModeAtMost
	// granted is what the request's take granted, for a refund.
	granted int64
}

// group is the requests of a batch that share a hash slot, and what their
// script answered.
type group struct {
	idx  []int
	vals []int64
	err  error
}

// Do implements weir.Store. A batch of several takes is all or nothing:
// all the requests are admitted and consume, or none consumes; a rejected
// request's penalty box still starts. Keys in one batch must be distinct
// (per algorithm). docs/internals.md ("Batches") describes batches whose
// keys span cluster slots. Each admitted take is dated by Redis's clock
// (Result.At): the TIME its script read (across cluster slots, each
// slot's own).
func (s *Store) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if len(results) < len(reqs) {
		return fmt.Errorf("redisstore: %d results for %d requests", len(results), len(reqs))
	}
	if len(reqs) > 1 && !s.conn.connected.Load() {
		return fmt.Errorf("%w: batch of %d: %w", weir.ErrStore, len(reqs), s.notConnectedError())
	}
	switch len(reqs) {
	case 0:
		return nil
	case 1:
		r := &reqs[0]
		switch r.Mode {
		case weir.ModeRelease:
			results[0] = weir.Result{}
			return s.release(ctx, r.Key, r.Limit, r.Lease)
		case weir.ModeReset:
			results[0] = weir.Result{}
			return s.reset(ctx, r.Key, r.Limit)
		}
		d, now, err := s.take(ctx, r)
		if err != nil {
			return err
		}
		results[0] = weir.ResultOf(d)
		weir.StampAdmitted(reqs, results, now)
		return nil
	}
	items, err := s.batchItems(reqs)
	if err != nil {
		return err
	}
	groups := s.groupBySlot(items)
	if len(groups) == 1 {
		g := &groups[0]
		g.vals, g.err = s.runGroup(ctx, items, g.idx, "take", "")
		if g.err != nil {
			return s.takeError(items, g)
		}
		fill(results, g.idx, g.vals)
		weir.StampAdmitted(reqs, results, g.vals[1])
		return nil
	}
	err = s.takeAcrossSlots(ctx, items, groups, results)
	if err == nil {
		// Each slot's takes by the TIME of the script that made them; a
		// batch refunded across slots consumed nothing and stays undated.
		for i := range groups {
			for _, j := range groups[i].idx {
				weir.StampAdmitted(reqs[j:j+1], results[j:j+1], groups[i].vals[1])
			}
		}
	}
	return err
}

// batchItems compiles the requests of a batch, checks their costs and that
// no key appears twice under one algorithm.
func (s *Store) batchItems(reqs []weir.Request) ([]item, error) {
	items := make([]item, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		if one(r) {
			return nil, fmt.Errorf("%w: a %s decides one request at a time, not a batch of %d", weir.ErrUnsupported, r.Mode, len(reqs))
		}
		l := r.Limit
		if s.overrides {
			l = s.patterned(r.Key, l)
		}
		c, err := s.compile(l)
		if err != nil {
			return nil, err
		}
		if err := r.CheckWith(&c.p); err != nil {
			return nil, err
		}
		n := r.N
		if r.Mode == weir.ModeAtMost {
			n = min(n, c.maxCost) // a partial grant may ask for more than fits
		}
		for j := 0; j < i; j++ {
			if reqs[j].Key == r.Key && items[j].c.p.Kind == c.p.Kind {
				return nil, fmt.Errorf("redisstore: %s appears twice under %s in one batch", keyRef(r.Key), c.algo)
			}
		}
		items[i] = item{req: r, c: c, k: s.names(r.Key, c.algo), id: s.memberID(c, n, r.Lease), mode: modeOf(r), n: n}
	}
	return items, nil
}

// takeAcrossSlots runs a batch whose keys lie in several cluster slots: one
// all-or-nothing script per slot, all at once, then refunds if any slot did
// not admit.
func (s *Store) takeAcrossSlots(ctx context.Context, items []item, groups []group, results []weir.Result) error {
	s.runGroups(ctx, items, groups, "take")
	var firstErr error
	allAdmitted := true
	for i := range groups {
		g := &groups[i]
		if g.err != nil {
			if firstErr == nil {
				firstErr = s.takeError(items, g)
			}
			allAdmitted = false
		} else if g.vals[0] != 1 {
			allAdmitted = false
		}
	}
	if allAdmitted {
		for i := range groups {
			fill(results, groups[i].idx, groups[i].vals)
		}
		return nil
	}
	// Refund the slots that admitted, even if the caller's context is done:
	// an undelivered refund keeps capacity consumed until it expires.
	var refunds []group
	for i := range groups {
		if g := &groups[i]; g.err == nil && g.vals[0] == 1 {
			refunds = append(refunds, group{idx: g.idx, vals: g.vals})
		}
	}
	s.runGroups(context.WithoutCancel(ctx), items, refunds, "refund")
	for i := range refunds {
		if r := &refunds[i]; r.err != nil {
			if firstErr == nil {
				firstErr = batchError("refund (capacity stays consumed until it expires)", items, r.idx, r.err)
			}
		} else {
			fill(results, r.idx, r.vals)
		}
	}
	s.refunded(context.WithoutCancel(ctx), items, refunds)
	if firstErr != nil {
		if errors.Is(firstErr, weir.ErrInvalidCost) {
			// Refused as memstore refuses it, before deciding: the slots
			// that admitted were refunded, and no result stands.
			clear(results[:len(items)])
		}
		return firstErr
	}
	for i := range groups {
		if g := &groups[i]; g.vals[0] != 1 {
			fill(results, g.idx, g.vals)
		}
	}
	return nil
}

// takeError is the error of a group's take: weir.ErrInvalidCost for a
// cost past a key's override (override.go), else batchError's.
func (s *Store) takeError(items []item, g *group) error {
	if s.overrides {
		at := func(j int) (string, int64) { it := &items[g.idx[j]]; return it.req.Key, it.req.N }
		if cerr := costError(g.err, "", 0, at); cerr != g.err {
			return cerr
		}
	}
	return batchError("take", items, g.idx, g.err)
}

func modeOf(r *weir.Request) algorithm.Mode { return r.AlgorithmMode() }

// OnRefund sets f, which the store calls with the key of every take that it
// gives back by itself. That happens in one case only: a batch (Do) whose
// keys span Redis Cluster hash slots is decided slot by slot, and when one
// slot rejects, the takes the others admitted are refunded. Between the take
// and its refund, another caller can be denied on such a key; a deny cache
// (package denycache: pass OnRefund as its Config.OnRefund) must
// drop that denial once the refund is done, on every instance, or it would
// deny requests that Redis has room for again.
//
// f runs on the caller's goroutine after the refund has been made, once per
// distinct key (a key whose refund failed keeps its capacity consumed and is
// not passed), with a context that is not cancelled with the caller's. A
// nil f turns it off. The last f set wins.
func (s *Store) OnRefund(f func(ctx context.Context, key string)) {
	if f == nil {
		s.onRefund.Store(nil)
		return
	}
	s.onRefund.Store(&f)
}

// refunded passes the keys of the refunds that were made to OnRefund's f.
func (s *Store) refunded(ctx context.Context, items []item, refunds []group) {
	f := s.onRefund.Load()
	if f == nil {
		return
	}
	var done []string
	for i := range refunds {
		r := &refunds[i]
		if r.err != nil {
			continue
		}
	next:
		for _, j := range r.idx {
			key := items[j].req.Key
			if items[j].granted <= 0 {
				continue // nothing was taken, nothing came back
			}
			for _, k := range done {
				if k == key {
					continue next
				}
			}
			done = append(done, key)
			(*f)(ctx, key)
		}
	}
}

// groupBySlot splits a batch by cluster hash slot, keeping request order
// within each group. Outside a cluster every key can go in one script.
func (s *Store) groupBySlot(items []item) []group {
	if !s.cluster {
		idx := make([]int, len(items))
		for i := range idx {
			idx[i] = i
		}
		return []group{{idx: idx}}
	}
	var groups []group
	var slots []uint16
next:
	for i := range items {
		sl := slot(items[i].k.tag)
		for j, have := range slots {
			if have == sl {
				groups[j].idx = append(groups[j].idx, i)
				continue next
			}
		}
		slots = append(slots, sl)
		groups = append(groups, group{idx: []int{i}})
	}
	return groups
}

// runGroups runs op on every group concurrently, each with its own retries.
func (s *Store) runGroups(ctx context.Context, items []item, groups []group, op string) {
	var wg sync.WaitGroup
	for i := range groups {
		g := &groups[i]
		takeNow := ""
		if op == "refund" {
			takeNow = strconv.FormatInt(g.vals[1], 10)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.vals, g.err = s.runGroup(ctx, items, g.idx, op, takeNow)
		}()
	}
	wg.Wait()
}

// runGroup runs the multi script over the requests idx of items: op "take"
// decides them all or nothing; op "refund" gives back what the take that
// ran at takeNow granted them (read from the take's reply in item order).
func (s *Store) runGroup(ctx context.Context, items []item, idx []int, op, takeNow string) ([]int64, error) {
	keys := make([]string, 0, 2*len(idx))
	args := make([]string, 0, 3+len(idx)*5)
	args = append(args, op, s.nowArg(), takeNow)
	for _, i := range idx {
		it := &items[i]
		keys = append(keys, it.k.state, it.k.block)
		granted := "0"
		if op == "refund" {
			granted = strconv.FormatInt(it.granted, 10)
		}
		args = append(args, strconv.FormatInt(it.n, 10), modeArg(it.mode), it.id, granted)
		args = append(args, s.argOf(it.c))
	}
	if e := s.evts.Load(); e != nil && op == "take" {
		// The events of the requests whose rules have them, in the same
		// call (multi.lua).
		first := true
		for j, i := range idx {
			it := &items[i]
			rule := events.RuleOf(it.req.Key)
			r, ok := e.rules[rule]
			if !ok {
				continue
			}
			if first {
				args[2] = strconv.Itoa(len(idx))
				ek := s.evKeys(it.k)
				keys = append(keys, ek[1], ek[2], ek[3])
				first = false
			}
			keys = append(keys, s.evMarker(it.k.tag))
			args = append(args, strconv.Itoa(j+1))
			args = append(args, s.evArgs(it.c, it.req.Key, rule, &r)...)
		}
	}
	vals, err := s.eval(ctx, &multiRoutine, keys, args, make([]int64, 0, 2+8*len(idx)))
	if err == nil && len(vals) != 2+8*len(idx) {
		err = fmt.Errorf("unexpected reply of %d values for %d requests", len(vals), len(idx))
	}
	if err == nil && op == "take" {
		for j, i := range idx {
			items[i].granted = vals[2+8*j+1]
		}
	}
	return vals, err
}

// fill decodes a multi reply into the results of the requests idx.
func fill(results []weir.Result, idx []int, vals []int64) {
	for j, i := range idx {
		results[i] = weir.ResultOf(decodeDecision(vals[2+8*j : 2+8*j+8]))
	}
}

// batchError wraps err with weir.ErrStore and names the batch's keys.
func batchError(what string, items []item, idx []int, err error) error {
	var b strings.Builder
	for n, i := range idx {
		if n == 3 {
			fmt.Fprintf(&b, ", … (%d keys)", len(idx))
			break
		}
		if n > 0 {
			b.WriteString(", ")
		}
		b.WriteString(keyRef(items[i].req.Key))
	}
	return fmt.Errorf("%w: batch %s on %s: %w", weir.ErrStore, what, b.String(), err)
}

// one reports whether r must be decided alone: every mode but a take
// (weir.ModeTake, weir.ModeAtMost) must.
func one(r *weir.Request) bool { return r.Mode != weir.ModeTake && r.Mode != weir.ModeAtMost }
