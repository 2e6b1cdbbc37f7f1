package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// The coalescer; docs/internals.md ("Coalescing") describes it.

// DefaultMaxInFlight is Config.MaxInFlight when zero.
const DefaultMaxInFlight = 2

// DefaultMaxBatch is Config.MaxBatch when zero.
const DefaultMaxBatch = 64

// MaxLinger bounds Config.Linger.
const MaxLinger = 10 * time.Millisecond

// call is one queued decision and, once its batch returns, its outcome.
type call struct {
	ctx      context.Context
	deadline time.Time // the store's timeout from the call, or ctx's deadline if sooner
	c        *compiled
	keys     [2]string
	n        int64
	mode     algorithm.Mode
	id       string

	// state is guarded by coalescer.mu: queued, sent, or abandoned (its
	// caller left the queue before it was sent).
	state int8
	vals  [9]int64 // the 8 decision values and the batch's now
	err   error
	again bool          // a Cluster node did not make it: to be sent again alone (nodes.go)
	done  chan struct{} // receives once the outcome is set
}

const (
	callQueued int8 = iota
	callSent
	callAbandoned
)

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// coalescer queues the decisions that find every in-flight slot busy.
type coalescer struct {
	s        *Store
	inFlight int // most calls out at once
	maxBatch int
	node     string        // on a Cluster, the address of the primary this queue sends to (nodes.go)
	linger   time.Duration // Config.Linger: how long a call that found a slot free waits for company

	mu   sync.Mutex
	busy int // calls out now; len(queue) > 0 only when busy == inFlight or lingering
	// lingering: a call holds a slot and waits (up to linger) for others
	// to join it; meanwhile every decision queues behind it, and the one
	// that makes the queue a full call signals full.
	lingering bool
	full      chan struct{} // capacity 1; made with the queue when linger > 0
	last      time.Time     // when the latest decision came (with a linger only)
	queue     []*call

	lingers   atomic.Int64 // calls that lingered (tests report it)
	batches   atomic.Int64 // calls sent (tests and benchmarks report it)
	decisions atomic.Int64 // decisions they carried
}

// newCoalescer makes a queue of inFlight calls of up to maxBatch decisions
// that linger as Config.Linger says, sending to the Cluster primary node
// ("" elsewhere).
func newCoalescer(s *Store, inFlight, maxBatch int, linger time.Duration, node string) *coalescer {
	q := &coalescer{s: s, inFlight: inFlight, maxBatch: maxBatch, node: node, linger: linger}
	if linger > 0 {
		q.full = make(chan struct{}, 1)
	}
	return q
}

// do makes c's decision, alone at once or in a batch, and sets its
// outcome. It returns an error instead when the caller's context ended
// first; c then must not be reused, since a batch may still hold it.
//
// No timer is made for a queued call: its deadline travels with it. The
// calls ahead of it were all sent before it came and end by their own
// deadlines, which are no later than its own; its batch is sent with the
// earliest deadline of its members; and a call whose deadline passed while
// it waited is failed, never sent. So every call ends by its deadline, and
// a heavily loaded store makes one timer per batch, not one per decision.
func (q *coalescer) do(ctx context.Context, c *call) error {
	now := time.Now()
	c.deadline = now.Add(q.s.timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(c.deadline) {
		c.deadline = dl
	}
	q.mu.Lock()
	// A call lingers only when the decision before this one came less
	// than a linger ago: company is likely. At light load nothing waits.
	linger := false
	if q.linger > 0 {
		linger = now.Sub(q.last) < q.linger
		q.last = now
	}
	if q.busy < q.inFlight && !q.lingering {
		q.busy++
		if linger {
			q.lead(ctx, c) // unlocks q.mu
			return q.wait(ctx, c)
		}
		q.mu.Unlock()
		one := [1]*call{c}
		dctx, cancel := context.WithDeadline(ctx, c.deadline)
		q.send(dctx, one[:])
		if next, deadline := q.next(); next != nil {
			go q.drain(next, deadline)
		}
		if c.again { // after giving the call back: a resend may wait out a migration
			q.s.resend(dctx, c)
		}
		cancel()
		return nil
	}
	c.ctx = ctx
	c.state = callQueued
	q.queue = append(q.queue, c)
	if q.lingering && len(q.queue) >= q.maxBatch {
		select {
		case q.full <- struct{}{}: // a full call: no reason to wait longer
		default:
		}
	}
	q.mu.Unlock()
	return q.wait(ctx, c)
}

// lead holds the in-flight slot it took for c (q.mu held, which it
// unlocks) while it lingers (do lets it when the decision before c came
// less than a linger before it): c waits in the queue, and so does every
// decision that comes meanwhile, until the queue holds a full call, the
// linger ends (or half of c's time to its deadline) or c's caller leaves.
// Then the queue leaves as calls do after a returning call, in batches of
// MaxBatch, by a goroutine of their own; the caller waits for c's outcome
// as a queued caller does. A full call never waits: the linger ends at
// once.
func (q *coalescer) lead(ctx context.Context, c *call) {
	c.ctx = ctx
	c.state = callQueued
	q.queue = append(q.queue, c)
	q.lingering = true
	full := len(q.queue) >= q.maxBatch
	q.mu.Unlock()
	q.lingers.Add(1)
	if !full {
		// Never more than half the time c has left: the call must still
		// reach Redis by its deadline.
		t := time.NewTimer(min(q.linger, time.Until(c.deadline)/2))
		select {
		case <-t.C:
		case <-q.full:
		case <-ctx.Done():
		}
		t.Stop()
	}
	q.mu.Lock()
	q.lingering = false
	select {
	case <-q.full: // a signal that came after the linger ended
	default:
	}
	q.mu.Unlock()
	if next, deadline := q.next(); next != nil {
		go q.drain(next, deadline)
	}
}

// wait waits for queued c's outcome, or for its caller to leave: see do.
func (q *coalescer) wait(ctx context.Context, c *call) error {
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	queued := c.state == callQueued
	if queued {
		q.remove(c)
		c.state = callAbandoned
	}
	q.mu.Unlock()
	if queued {
		return notSent{fmt.Errorf("not sent: %w while waiting for a free call to Redis", ctx.Err())}
	}
	select {
	case <-c.done: // the outcome is here after all
		return nil
	default:
		return fmt.Errorf("%w after the decision was sent (it may have been made)", ctx.Err())
	}
}

// notSent is the error of a decision failed while still queued: it was
// never sent to Redis. It reads as its cause and matches both that cause
// (context.Canceled or DeadlineExceeded) and weir.ErrNotSent, which tells
// circuit breakers and store-error metrics not to count it.
type notSent struct{ err error }

func (e notSent) Error() string   { return e.err.Error() }
func (e notSent) Unwrap() []error { return []error{e.err, weir.ErrNotSent} }

// remove takes c out of the queue; q.mu is held.
func (q *coalescer) remove(c *call) {
	for i, x := range q.queue {
		if x == c {
			copy(q.queue[i:], q.queue[i+1:])
			q.queue[len(q.queue)-1] = nil
			q.queue = q.queue[:len(q.queue)-1]
			return
		}
	}
}

// next takes the next batch off the queue, with the earliest deadline of
// its members, or gives up the caller's in-flight slot if the queue is
// empty. Calls whose caller left or whose deadline passed are failed
// without being sent.
func (q *coalescer) next() ([]*call, time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var batch []*call
	var deadline time.Time
	for len(q.queue) > 0 && len(batch) == 0 {
		n := min(len(q.queue), q.maxBatch)
		now := time.Now()
		for _, c := range q.queue[:n] {
			var err error
			if err = c.ctx.Err(); err != nil {
				err = notSent{fmt.Errorf("not sent: %w while waiting for a free call to Redis", err)}
			} else if !now.Before(c.deadline) {
				err = notSent{fmt.Errorf("not sent: %w: the store's timeout of %v passed while the call waited for a free call to Redis", context.DeadlineExceeded, q.s.timeout)}
			}
			if err != nil {
				c.state = callAbandoned
				c.err = err
				c.done <- struct{}{}
				continue
			}
			c.state = callSent
			c.ctx = nil
			if batch == nil {
				batch = make([]*call, 0, n)
				deadline = c.deadline
			} else if c.deadline.Before(deadline) {
				deadline = c.deadline
			}
			batch = append(batch, c)
		}
		rest := copy(q.queue, q.queue[n:])
		clear(q.queue[rest:])
		q.queue = q.queue[:rest]
	}
	if batch == nil {
		q.busy--
	}
	return batch, deadline
}

// drain sends batches until the queue is empty.
func (q *coalescer) drain(batch []*call, deadline time.Time) {
	for batch != nil {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		q.send(ctx, batch)
		cancel()
		for _, c := range batch {
			if c.again {
				// Sent again alone, by its own deadline, without holding
				// up this queue's call: a resend may wait out a migration.
				go func() {
					rctx, cancel := context.WithDeadline(context.Background(), c.deadline)
					q.s.resend(rctx, c)
					cancel()
					c.done <- struct{}{}
				}()
				continue
			}
			c.done <- struct{}{}
		}
		batch, deadline = q.next()
	}
}

// send makes the decisions of batch in one call of the batch function and
// sets each call's outcome; or, for those a Cluster node did not make,
// sets again (the caller sends them again alone).
func (q *coalescer) send(ctx context.Context, batch []*call) {
	q.batches.Add(1)
	q.decisions.Add(int64(len(batch)))
	s := q.s
	// The distinct limits, each sent once.
	var limits [8]*compiled
	ls := limits[:0]
	index := make([]int, len(batch))
	for i, c := range batch {
		j := 0
		for j < len(ls) && ls[j] != c.c {
			j++
		}
		if j == len(ls) {
			ls = append(ls, c.c)
		}
		index[i] = j + 1
	}
	// On a Cluster node the keys go first in ARGV, undeclared (nbatch).
	nk := 0
	if q.node != "" {
		nk = 1 + 2*len(batch)
	}
	args := make([]string, nk, nk+2+len(ls)+4*len(batch))
	var keys []string
	if q.node != "" {
		args[0] = strconv.Itoa(2 * len(batch))
		for i, c := range batch {
			args[1+2*i], args[2+2*i] = c.keys[0], c.keys[1]
		}
	} else {
		keys = make([]string, 0, 2*len(batch)+1)
		for _, c := range batch {
			keys = append(keys, c.keys[0], c.keys[1])
		}
		if s.overrides {
			// The index of overrides, last (batch.lua): while it is
			// empty no key has an override, and the script reads none.
			keys = append(keys, s.ovrIndex())
		}
	}
	args = append(args, s.nowArg(), strconv.Itoa(len(ls)))
	for _, c := range ls {
		args = append(args, s.argOf(c))
	}
	for i, c := range batch {
		args = append(args, smallInt(index[i]), strconv.FormatInt(c.n, 10), modeArg(c.mode), c.id)
	}
	var arr []rueidis.RedisMessage
	var err error
	if q.node == "" {
		arr, err = s.call(ctx, &batchRoutine, keys, args)
	} else if arr, err = s.callNode(ctx, q.node, args); errors.Is(err, errNodeRefused) {
		for _, c := range batch {
			c.again = true // the node ran none of it
		}
		return
	}
	if err == nil && len(arr) != 1+8*len(batch) {
		err = fmt.Errorf("unexpected reply of %d values for %d decisions", len(arr), len(batch))
	}
	var now int64
	if err == nil {
		now, err = arr[0].AsInt64()
	}
	for i, c := range batch {
		if err != nil {
			c.err = err
			continue
		}
		c.err = batchDecision(arr, i, c.vals[:8])
		c.vals[8] = now
		if c.err != nil && q.node != "" && notLocal(c.err) {
			c.again = true // not made: its slot is elsewhere, or moving
		}
	}
}

// smallInt formats the limit numbers of a batch without allocating.
func smallInt(i int) string {
	if i < len(smallInts) {
		return smallInts[i]
	}
	return strconv.Itoa(i)
}

var smallInts = func() (s [65]string) {
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return
}()

// batchDecision reads decision i (from 0) of a batch function's flat
// reply (batch.lua) into dst, its 8 values; or returns the decision's
// error reply, which stands in place of its first value.
func batchDecision(arr []rueidis.RedisMessage, i int, dst []int64) error {
	vals := arr[1+8*i : 1+8*i+8]
	for j := range vals {
		var err error
		if dst[j], err = vals[j].AsInt64(); err != nil {
			if j == 0 {
				if re := vals[0].Error(); re != nil {
					return re
				}
			}
			return fmt.Errorf("reply value %d: %w", j, err)
		}
	}
	return nil
}

// takeCoalesced makes one decision through the coalescer and returns its
// eight values and the clock reading it was made at.
func (s *Store) takeCoalesced(ctx context.Context, q *coalescer, c *compiled, k keyNames, n int64, mode algorithm.Mode, id string) ([9]int64, error) {
	cl := callPool.Get().(*call)
	cl.c, cl.keys, cl.n, cl.mode, cl.id = c, [2]string{k.state, k.block}, n, mode, id
	if err := q.do(ctx, cl); err != nil {
		return [9]int64{}, err // cl may still be in a batch: not reused
	}
	vals, err := cl.vals, cl.err
	*cl = call{done: cl.done}
	callPool.Put(cl)
	return vals, err
}

// batchStats returns the calls of the batch functions the store has sent
// and the decisions they carried, over all its queues (tests and
// benchmarks report them).
func (s *Store) batchStats() (batches, decisions int64) {
	if q := s.coalesce; q != nil {
		batches, decisions = q.batches.Load(), q.decisions.Load()
	}
	if s.nodes != nil {
		for _, q := range *s.nodes.queues.Load() {
			batches += q.batches.Load()
			decisions += q.decisions.Load()
		}
	}
	return batches, decisions
}
