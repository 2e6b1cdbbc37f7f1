package memstore

import (
	"unsafe"

	"github.com/weir-dev/weir/algorithm"
)

// A key's state is held inline in its slot (table.go) as at most three
// integers, the ones its algorithm keeps, instead of a pointer to a
// 200-byte algorithm.State. A decision loads them into the shard's scratch
// State, runs the algorithm on it, and stores them back. A state that has
// anything else set (a penalty box or its history, a debt, a sliding log,
// concurrency leases, a bucketed window) moves to a State of its own on
// the heap, the slot's x, and stays there.

// layout says which State fields a slot's three integers hold.
type layout uint8

const (
	layoutNone   layout = iota // nothing inline: only the empty state packs
	layoutWindow               // Window, Count, Prev (fixed and sliding windows)
	layoutBucket               // Level, TS, WarmStart (token and leaky buckets, warm-up)
	layoutGCRA                 // TAT, Frac
)

// layoutOf returns the layout for a compiled limit. A warm-up runs both
// buckets on Level, TS and WarmStart (package algorithm, warmup.go).
func layoutOf(p *algorithm.Params) layout {
	if p.Warmup > 0 {
		return layoutBucket
	}
	switch p.Kind {
	case algorithm.FixedWindow, algorithm.SlidingWindow:
		return layoutWindow
	case algorithm.TokenBucket, algorithm.LeakyBucket:
		return layoutBucket
	case algorithm.GCRA:
		return layoutGCRA
	}
	return layoutNone
}

// plainOf reports whether a decision under p (a Take or Check, not a
// debit or credit) on a state packed under lay can only change lay's
// integers, so that the state stays packed and storing them back is all
// that pack would do (memstore's take skips pack's look at the rest).
// What would set more: a penalty box (Block), the count ring of a
// bucketed sliding window (Buckets), a sliding log's entries and
// concurrency's leases (layoutNone). Debt is set only by a debit.
// TestPlainKeepsPacked checks it on random workloads.
func plainOf(p *algorithm.Params, lay layout) bool {
	return lay != layoutNone && p.Block == 0 && p.Buckets == 0
}

// storePacked writes lay's integers of st, which must pack under lay (see
// plainOf), to v. It writes each element itself: returning the three as
// an array stored them to a temporary first, which was then copied with
// 16-byte loads over 8-byte stores, a load the CPU cannot forward from the
// stores and waits for.
func storePacked(lay layout, st *algorithm.State, v *[3]int64) {
	switch lay {
	case layoutWindow:
		v[0], v[1], v[2] = st.Window, st.Count, st.Prev
	case layoutBucket:
		v[0], v[1], v[2] = st.Level, st.TS, st.WarmStart
	case layoutGCRA:
		v[0], v[1], v[2] = st.TAT, st.Frac, 0
	default:
		*v = [3]int64{}
	}
}

// unpack sets st to the state v holds under lay. Every field of st that no
// layout holds must already be zero (the scratch's invariant: see pack).
//
// WarmStart, on another cache line than the counters and zero unless a
// limit has a warm-up, is written only when it changes: a line a decision
// only reads stays in both cores' caches (see prefetch.go).
func unpack(lay layout, v *[3]int64, st *algorithm.State) {
	st.Window, st.Count, st.Prev = 0, 0, 0
	st.Level, st.TS = 0, 0
	st.TAT, st.Frac = 0, 0
	var warm int64
	switch lay {
	case layoutWindow:
		st.Window, st.Count, st.Prev = v[0], v[1], v[2]
	case layoutBucket:
		st.Level, st.TS, warm = v[0], v[1], v[2]
	case layoutGCRA:
		st.TAT, st.Frac = v[0], v[1]
	}
	if st.WarmStart != warm {
		st.WarmStart = warm
	}
}

// pack stores st into v under lay and reports true if v now holds all of
// st: every field outside lay's is zero. It writes v only then.
func pack(lay layout, st *algorithm.State, v *[3]int64) bool {
	var a, b, c, other int64
	switch lay {
	case layoutWindow:
		a, b, c = st.Window, st.Count, st.Prev
		other = st.Level | st.TS | st.WarmStart | st.TAT | st.Frac
	case layoutBucket:
		a, b, c = st.Level, st.TS, st.WarmStart
		other = st.Window | st.Count | st.Prev | st.TAT | st.Frac
	case layoutGCRA:
		a, b = st.TAT, st.Frac
		other = st.Window | st.Count | st.Prev | st.Level | st.TS | st.WarmStart
	default:
		other = st.Window | st.Count | st.Prev | st.Level | st.TS | st.WarmStart | st.TAT | st.Frac
	}
	if other|st.Held|st.BlockedUntil|st.Strikes|st.LastBox != 0 || st.Debt || st.Leases != nil || !logZero(&st.Log) {
		return false
	}
	v[0], v[1], v[2] = a, b, c
	return true
}

// logWords is an algorithm.Log seen as machine words.
type logWords [unsafe.Sizeof(algorithm.Log{}) / unsafe.Sizeof(uintptr(0))]uintptr

// logZero reports whether l is the zero Log, every word of it (its fields
// are unexported). Padding is never written, so a Log that was never used
// is all zeros; one that was, even if empty now, keeps its arrays.
func logZero(l *algorithm.Log) bool {
	var or uintptr
	for _, w := range (*logWords)(unsafe.Pointer(l)) {
		or |= w
	}
	return or == 0
}

// spill moves st to a State of its own and leaves st zero.
func spill(st *algorithm.State) *algorithm.State {
	x := new(algorithm.State)
	*x = *st
	*st = algorithm.State{}
	return x
}
