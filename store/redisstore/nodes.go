package redisstore

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Coalescing on a Redis Cluster; docs/internals.md ("Coalescing on a
// Cluster") describes it.
//
// One call cannot declare keys of two slots, but a function flagged
// allow-cross-slot-keys may touch undeclared keys of every slot its node
// serves. So a Cluster store keeps a queue per primary, routes each
// decision to the queue of the node its slot's owner (as CLUSTER SLOTS
// last said), and sends each batch to that node's own connection as
// nbatch (batch.lua). Before a decision touches anything, nbatch checks
// that the node serves its slot and that no migration of it is under way;
// a decision that fails the check was not made, and is sent again alone
// through the cluster client, which follows MOVED and ASK.

// numSlots is the number of Redis Cluster hash slots.
const numSlots = 16384

// slotTable maps every hash slot to the address of its primary: owner[i]
// is an index into addrs plus one, 0 when CLUSTER SLOTS named none.
type slotTable struct {
	owner [numSlots]uint16
	addrs []string
}

// nodeQueues routes a Cluster store's decisions to per-node coalescers.
type nodeQueues struct {
	s        *Store
	inFlight int
	maxBatch int
	linger   time.Duration

	table  atomic.Pointer[slotTable]
	queues atomic.Pointer[map[string]*coalescer] // copy on write, under mu
	mu     sync.Mutex

	refreshing  atomic.Bool
	lastRefresh atomic.Int64 // UnixNano of the last refresh started
	refreshes   atomic.Int64 // slot tables read (tests report it)

	resent atomic.Int64 // decisions a node did not make, sent again alone (tests report it)
}

// minRefreshEvery spaces the slot table's refreshes: a migration makes
// every batch on its slot ask for one, and one a tick is plenty.
const minRefreshEvery = 100 * time.Millisecond

func newNodeQueues(s *Store, inFlight, maxBatch int, linger time.Duration) *nodeQueues {
	nq := &nodeQueues{s: s, inFlight: inFlight, maxBatch: maxBatch, linger: linger}
	empty := map[string]*coalescer{}
	nq.queues.Store(&empty)
	return nq
}

// queue returns the coalescer of the node that serves tag's slot, or nil
// when the store does not know it (no table yet, or a slot without an
// owner): the decision then goes alone.
func (nq *nodeQueues) queue(tag string) *coalescer {
	t := nq.table.Load()
	if t == nil {
		nq.refresh()
		return nil
	}
	i := t.owner[slot(tag)]
	if i == 0 {
		nq.refresh()
		return nil
	}
	addr := t.addrs[i-1]
	if q := (*nq.queues.Load())[addr]; q != nil {
		return q
	}
	nq.mu.Lock()
	defer nq.mu.Unlock()
	old := *nq.queues.Load()
	if q := old[addr]; q != nil {
		return q
	}
	// One queue per address the slot table names: bounded by the
	// cluster's size, never by requests.
	m := make(map[string]*coalescer, len(old)+1)
	for a, q := range old {
		m[a] = q
	}
	q := newCoalescer(nq.s, nq.inFlight, nq.maxBatch, nq.linger, addr)
	m[addr] = q
	nq.queues.Store(&m)
	return q
}

// refresh reads the slot table again in the background, unless it was
// read less than minRefreshEvery ago or is being read now.
func (nq *nodeQueues) refresh() {
	now := time.Now().UnixNano()
	if now-nq.lastRefresh.Load() < int64(minRefreshEvery) || !nq.refreshing.CompareAndSwap(false, true) {
		return
	}
	nq.lastRefresh.Store(now)
	go func() {
		defer nq.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = nq.load(ctx)
	}()
}

// load reads CLUSTER SLOTS and puts the table in force, dropping the
// queues of addresses it no longer names (their calls out end by
// themselves, and decisions still queued on them are sent all the same).
func (nq *nodeQueues) load(ctx context.Context) error {
	c := nq.s.client
	msg, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return err
	}
	t, err := parseSlotTable(msg)
	if err != nil {
		return err
	}
	nq.refreshes.Add(1)
	nq.table.Store(t)
	nq.mu.Lock()
	defer nq.mu.Unlock()
	old := *nq.queues.Load()
	m := make(map[string]*coalescer, len(t.addrs))
	for _, a := range t.addrs {
		if q := old[a]; q != nil {
			m[a] = q
		}
	}
	nq.queues.Store(&m)
	return nil
}

// parseSlotTable reads a CLUSTER SLOTS reply: ranges of slots, each with
// its primary's endpoint and port first. Addresses are written as rueidis
// names its nodes (host:port), so that Client.Nodes finds them. A primary
// with an unknown endpoint ("" or "?") leaves its slots without an owner.
func parseSlotTable(ranges []rueidis.RedisMessage) (*slotTable, error) {
	t := &slotTable{}
	index := map[string]uint16{}
	for _, r := range ranges {
		v, err := r.ToArray()
		if err != nil || len(v) < 3 {
			return nil, errors.New("unexpected CLUSTER SLOTS reply")
		}
		start, err1 := v[0].AsInt64()
		end, err2 := v[1].AsInt64()
		primary, err3 := v[2].ToArray()
		if err := errors.Join(err1, err2, err3); err != nil || len(primary) < 2 || start < 0 || end >= numSlots || start > end {
			return nil, errors.New("unexpected CLUSTER SLOTS range")
		}
		host, _ := primary[0].ToString()
		port, err := primary[1].AsInt64()
		if err != nil || host == "" || host == "?" {
			continue
		}
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		i, ok := index[addr]
		if !ok {
			t.addrs = append(t.addrs, addr)
			i = uint16(len(t.addrs))
			index[addr] = i
		}
		for s := start; s <= end; s++ {
			t.owner[s] = i
		}
	}
	return t, nil
}

// errNodeRefused is sendNode's error when the node ran none of the batch.
var errNodeRefused = errors.New("the node ran none of the batch")

// callNode sends the node batch function to the node at addr, with args
// as nbatch reads them, under ctx. A missing library is loaded and the
// call sent again, as call does. It returns an error wrapping
// errNodeRefused when the node refused the call before running any of it
// (a refusal that ran nothing, a node the client does not know, Functions
// gone): its decisions may then be sent again. Any other error may come
// after the batch ran.
func (s *Store) callNode(ctx context.Context, addr string, args []string) ([]rueidis.RedisMessage, error) {
	reloaded := false
	for {
		if !s.functions.Load() {
			return nil, errNodeRefused
		}
		node := s.client.Nodes()[addr]
		if node == nil {
			return nil, errNodeRefused
		}
		gen := s.libGen.Load()
		cmd := node.B().Fcall().Function(nodeBatchFn).Numkeys(0).Arg(args...).Build()
		arr, err := node.Do(ctx, cmd).ToArray()
		if err == nil {
			return arr, nil
		}
		re, ok := rueidis.IsRedisErr(err)
		if !ok {
			return nil, err
		}
		switch {
		case functionMissing(re) && !reloaded:
			reloaded = true
			if err := s.reloadLibrary(ctx, gen); err != nil {
				return nil, err
			}
			continue
		case fcallRefused(re):
			s.functions.Store(false)
			return nil, errNodeRefused
		case notRun(re) || strings.HasPrefix(re.Error(), "MOVED") || strings.HasPrefix(re.Error(), "ASK"):
			return nil, errNodeRefused
		}
		return nil, err
	}
}

// notLocal reports nbatch's answer for a decision whose slot the node did
// not serve, or was migrating: the decision was not made.
func notLocal(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && strings.HasPrefix(re.Error(), "WEIRNOTLOCAL")
}

// resend makes c's decision alone, through the cluster client, which
// follows MOVED and ASK; call retries TRYAGAIN. A node did not make it
// where the store sent it first, so it is not made twice.
func (s *Store) resend(ctx context.Context, c *call) {
	s.nodes.resent.Add(1)
	s.nodes.refresh()
	c.vals, c.err = s.takeAlone(ctx, c.c, c.keys, c.n, c.mode, c.id)
}
