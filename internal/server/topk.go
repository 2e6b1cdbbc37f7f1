package server

import (
	"sort"
	"sync"
)

// TopK keeps the K most frequent items of a stream in bounded memory with
// the space-saving algorithm (Metwally, Agrawal and El Abbadi, 2005).
//
// It monitors at most K items, each with a count and an error bound. A
// monitored item's count grows by the weight added. A new item, while
// fewer than K are monitored, starts at its weight; once K are monitored it
// evicts the item with the smallest count c and inherits it: count c plus
// the weight, error c. Hence, for every monitored item,
//
//	true count ≤ Count ≤ true count + Error,  and  Error ≤ N/K,
//
// where N is the total weight added so far. Any item whose true count
// exceeds N/K is guaranteed to be monitored. The service keeps one TopK of
// limited identities per rule; the dashboard shows the heaviest.
//
// A TopK is safe for concurrent use.
type TopK struct {
	mu    sync.Mutex
	k     int
	total int64
	heap  []*topItem          // a min-heap on count
	index map[string]*topItem // item → its heap entry
}

type topItem struct {
	key   string
	count int64
	err   int64
	pos   int // index in heap
}

// TopEntry is one monitored item of a TopK.
type TopEntry struct {
	// Identity is the item.
	Identity string `json:"identity"`
	// Count overestimates the item's true count by at most Error.
	Count int64 `json:"count"`
	// Error bounds the overestimate: the true count is at least
	// Count-Error.
	Error int64 `json:"error"`
}

// NewTopK returns a TopK monitoring at most k items (at least 1).
func NewTopK(k int) *TopK {
	k = max(k, 1)
	return &TopK{k: k, index: make(map[string]*topItem, k)}
}

// K returns how many items the TopK monitors at most.
func (t *TopK) K() int { return t.k }

// Add records w more occurrences of key. Weights of 0 or less are ignored.
func (t *TopK) Add(key string, w int64) { t.addUncertain(key, w, 0) }

// addUncertain adds w to key, of which up to e may be an overestimate
// (an entry of another sketch, merged in): key's error grows by e.
func (t *TopK) addUncertain(key string, w, e int64) {
	if w <= 0 {
		return
	}
	e = min(max(e, 0), w)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += w
	if it, ok := t.index[key]; ok {
		it.count += w
		it.err += e
		t.down(it.pos)
		return
	}
	if len(t.heap) < t.k {
		it := &topItem{key: key, count: w, err: e, pos: len(t.heap)}
		t.heap = append(t.heap, it)
		t.index[key] = it
		t.up(it.pos)
		return
	}
	// Replace the minimum: it keeps its count as the newcomer's error.
	it := t.heap[0]
	delete(t.index, it.key)
	it.key, it.err = key, it.count+e
	it.count += w
	t.index[key] = it
	t.down(0)
}

// Total returns N, the total weight added.
func (t *TopK) Total() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// Top returns up to n monitored items, heaviest first (ties by identity).
// n ≤ 0 returns them all.
func (t *TopK) Top(n int) []TopEntry {
	t.mu.Lock()
	out := make([]TopEntry, len(t.heap))
	for i, it := range t.heap {
		out[i] = TopEntry{Identity: it.key, Count: it.count, Error: it.err}
	}
	t.mu.Unlock()
	sortEntries(out)
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

func sortEntries(es []TopEntry) {
	sort.Slice(es, func(i, j int) bool {
		if es[i].Count != es[j].Count {
			return es[i].Count > es[j].Count
		}
		return es[i].Identity < es[j].Identity
	})
}

func (t *TopK) less(i, j int) bool { return t.heap[i].count < t.heap[j].count }

func (t *TopK) swap(i, j int) {
	t.heap[i], t.heap[j] = t.heap[j], t.heap[i]
	t.heap[i].pos, t.heap[j].pos = i, j
}

func (t *TopK) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !t.less(i, p) {
			return
		}
		t.swap(i, p)
		i = p
	}
}

func (t *TopK) down(i int) {
	n := len(t.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && t.less(r, l) {
			m = r
		}
		if !t.less(m, i) {
			return
		}
		t.swap(i, m)
		i = m
	}
}
