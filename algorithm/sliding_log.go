package algorithm

// sliding_log: every admitted event inside the window, one entry per
// admitting call (see Log). Mirrors scripts/sliding_log.lua, whose ZSET
// holds the same entries as members "<end>:<weight>:<call id>".

// slidingLog decides a sliding log (ALG.sliding_log.decide; its load
// drops the entries that left the window, which here is the first step).
func slidingLog(p *Params, s *State, now, cost int64, mode Mode, apply bool) (granted, remaining, retryAfter, resetAfter, delay int64) {
	// Drop entries that left the window: ts + Period <= now.
	for s.Log.size > 0 && s.Log.TS(0)+p.Period <= now {
		s.Log.popFront()
	}
	// Every event counts: beyond Rate only after a lowered limit or a
	// debit (debt), which then waits for the oldest to leave.
	count := s.Log.events()
	g := grant(cost, p.Rate-count, mode)
	if g == 0 {
		// The (count+cost−Rate)-th oldest event must leave the window.
		k := count + cost - p.Rate
		retryAfter = s.Log.eventTS(k-1) + p.Period - now
	} else if apply {
		s.Log.push(now, g, p.Rate) // keeps the newest Rate events
		count += g
	}
	granted, remaining = g, max(p.Rate-count, 0)
	if s.Log.size > 0 {
		// The newest entry leaves last.
		resetAfter = s.Log.TS(s.Log.size-1) + p.Period - now
	}
	return
}

// slidingLogRefund removes the g events a take at takeNow added (what is
// left of them, if the log has since dropped its oldest events) from the
// first entry at or after takeNow, and moves the ends of the entries after
// it back. The Lua finds the take's own member by its call id; a Log has
// no ids, as it merges the calls of one microsecond into one entry, whose
// events are alike. The two differ only after a clock stepped back, which
// can put an earlier call's entry between takeNow and the take's.
func slidingLogRefund(p *Params, s *State, takeNow, now, g int64, id string) bool {
	if takeNow+p.Period <= now {
		return false // the take's events have left the window (the Lua's load dropped them)
	}
	return s.Log.remove(takeNow, g)
}

// logDebtCap is the most events a sliding log holds: twice its rate, so
// that a key in debt keeps at most 2·Rate entries (a debit past it drops
// the oldest events, which would leave first).
func logDebtCap(p *Params) int64 { return 2 * p.Rate }

// slidingLogDebit adds n events at now, past the rate if need be (debt),
// keeping at most logDebtCap (ALG.sliding_log.debit).
func slidingLogDebit(p *Params, s *State, now, n int64) {
	for s.Log.size > 0 && s.Log.TS(0)+p.Period <= now {
		s.Log.popFront()
	}
	c := logDebtCap(p)
	s.Log.push(now, min(n, c), c)
}

// slidingLogCredit takes back up to n of the newest events
// (ALG.sliding_log.credit).
func slidingLogCredit(p *Params, s *State, now, n int64) {
	for s.Log.size > 0 && s.Log.TS(0)+p.Period <= now {
		s.Log.popFront()
	}
	s.Log.dropNewest(n)
}

// Log is a sliding log: the admitted events still inside the window, as a
// ring buffer of entries in the order they were admitted. One entry holds
// every event one call admitted at one instant (a call of cost n is one
// entry of weight n, and calls at the same microsecond share one), so a
// key's memory is one entry per admitting call in the window, never one per
// event: at most min(calls, Rate) entries of 12 bytes.
//
// An entry stores its timestamp and the running count of events up to and
// including it (end), modulo 2^32: the events a key holds never exceed
// maxLogSize, so differences of ends are exact. The i-th oldest event is
// then found by a binary search over the entries.
type Log struct {
	ts         []int64  // µs, ascending (a clock that steps back is clamped)
	end        []uint32 // running event count at the end of each entry
	head, size int      // entries
	base       uint32   // running count before the oldest entry
}

// Len returns the number of entries held (not events; see events).
func (l *Log) Len() int { return l.size }

// events returns the number of events held.
func (l *Log) events() int64 {
	if l.size == 0 {
		return 0
	}
	return int64(l.end[l.idx(l.size-1)] - l.base)
}

// capacity returns the number of entries the buffer can hold without growing.
func (l *Log) capacity() int { return len(l.ts) }

func (l *Log) idx(i int) int {
	j := l.head + i
	if j >= len(l.ts) {
		j -= len(l.ts)
	}
	return j
}

// TS returns the timestamp of the i-th oldest entry.
func (l *Log) TS(i int) int64 { return l.ts[l.idx(i)] }

// weight returns the number of events of the i-th oldest entry.
func (l *Log) weight(i int) int64 {
	prev := l.base
	if i > 0 {
		prev = l.end[l.idx(i-1)]
	}
	return int64(l.end[l.idx(i)] - prev)
}

// eventTS returns the timestamp of the j-th oldest event (0-based): that of
// the first entry whose running count passes base+j.
func (l *Log) eventTS(j int64) int64 {
	lo, hi := 0, l.size-1
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if int64(l.end[l.idx(mid)]-l.base) > j {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return l.TS(lo)
}

// popFront drops the oldest entry.
func (l *Log) popFront() {
	l.base = l.end[l.head]
	l.head = l.idx(1)
	l.size--
	if l.size == 0 {
		l.head = 0
	}
}

// dropOldest drops the k oldest events, k <= Events().
func (l *Log) dropOldest(k int64) {
	for k > 0 && l.size > 0 {
		if w := l.weight(0); w <= k {
			l.popFront()
			k -= w
		} else {
			l.base += uint32(k)
			k = 0
		}
	}
}

// dropNewest drops the k newest events: whole entries, then part of the
// newest one.
func (l *Log) dropNewest(k int64) {
	for k > 0 && l.size > 0 {
		j := l.idx(l.size - 1)
		if w := l.weight(l.size - 1); w <= k {
			l.size--
			k -= w
			if l.size == 0 {
				l.head = 0
			}
		} else {
			l.end[j] -= uint32(k)
			k = 0
		}
	}
}

// push appends g events at t, keeping at most limit events (the newest),
// as the log of a lowered limit must.
func (l *Log) push(t, g, limit int64) {
	if l.size > 0 {
		last := l.idx(l.size - 1)
		t = max(t, l.ts[last]) // keep the log ascending if the clock stepped back
		if l.ts[last] == t {
			l.end[last] += uint32(g)
			l.dropOldest(l.events() - min(l.events(), limit))
			return
		}
	}
	// Grow by doubling, so that a key pays for the entries it holds, not
	// for its limit; shrink when a quarter full.
	if l.size == len(l.ts) || (len(l.ts) > 8 && 4*l.size < len(l.ts)) {
		l.resize(max(2*l.size, 4))
	}
	prev := l.base
	if l.size > 0 {
		prev = l.end[l.idx(l.size-1)]
	}
	j := l.idx(l.size)
	l.ts[j], l.end[j] = t, prev+uint32(g)
	l.size++
	l.dropOldest(l.events() - min(l.events(), limit))
}

func (l *Log) resize(n int) {
	ts, end := make([]int64, n), make([]uint32, n)
	for i := 0; i < l.size; i++ {
		ts[i], end[i] = l.TS(i), l.end[l.idx(i)]
	}
	l.ts, l.end, l.head = ts, end, 0
}

// removeAt removes up to g events of the entry at exactly t, if there is
// one (a settlement's refund: SettleTake).
func (l *Log) removeAt(t, g int64) bool {
	i := 0
	for i < l.size && l.TS(i) < t {
		i++
	}
	if i == l.size || l.TS(i) != t {
		return false
	}
	return l.remove(t, g)
}

// remove takes up to g events out of the first entry at or after t,
// dropping the entry if none is left, and reports whether it found one.
func (l *Log) remove(t, g int64) bool {
	i := 0
	for i < l.size && l.TS(i) < t {
		i++
	}
	if i == l.size {
		return false
	}
	k := uint32(min(g, l.weight(i)))
	for j := i; j < l.size; j++ {
		l.end[l.idx(j)] -= k
	}
	if l.weight(i) > 0 {
		return true
	}
	for j := i; j < l.size-1; j++ {
		a, b := l.idx(j), l.idx(j+1)
		l.ts[a], l.end[a] = l.ts[b], l.end[b]
	}
	l.size--
	if l.size == 0 {
		l.head = 0
	}
	return true
}
