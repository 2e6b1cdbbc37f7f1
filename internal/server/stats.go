package server

import (
	"math"
	"math/bits"
	"sync"
	"time"
)

// The outcomes counted per second. A decision the on_error fallback made
// counts by what it decided (allowed, limited…) and also in outFallback,
// which is not an outcome of its own. Errors are Envoy calls that failed
// with no answer.
const (
	outAllowed = iota
	outLimited
	outShadowLimited
	outErrors
	outFallback // decisions made by the fallback, also counted above
	// admitted decisions near the limit (policy.NearLimit), also counted
	// above; last, so that an older instance's fleet report, one count
	// shorter, still decodes
	outNearLimit
	numOutcomes
)

// counts holds one second's decisions by outcome.
type counts [numOutcomes]int64

func (c *counts) add(o counts) {
	for i := range c {
		c[i] += o[i]
	}
}

func (c counts) decisions() int64 {
	return c[outAllowed] + c[outLimited] + c[outShadowLimited] + c[outErrors]
}

// seriesLen is how many seconds of counters every ring keeps: five minutes.
const seriesLen = 300

// series is a ring of per-second counters indexed by Unix second. A slot
// whose stamp is not the second asked for holds an older second and reads
// as zero.
type series struct {
	stamp [seriesLen]int64
	c     [seriesLen]counts
}

func (s *series) slot(sec int64) *counts {
	i := sec % seriesLen
	if i < 0 {
		i += seriesLen
	}
	if s.stamp[i] != sec {
		s.stamp[i] = sec
		s.c[i] = counts{}
	}
	return &s.c[i]
}

func (s *series) add(sec int64, outcome int, n int64) { s.slot(sec)[outcome] += n }

// set overwrites one second, as a newer report from another instance does.
func (s *series) set(sec int64, c counts) { *s.slot(sec) = c }

func (s *series) get(sec int64) counts {
	i := sec % seriesLen
	if i < 0 {
		i += seriesLen
	}
	if s.stamp[i] != sec {
		return counts{}
	}
	return s.c[i]
}

// latency buckets: four per doubling from 1µs, up to about 17 minutes.
const (
	latBucketsPerDoubling = 4
	latBuckets            = 30 * latBucketsPerDoubling
	latWindowSpan         = 10 // seconds per sub-window
	latWindows            = 6  // sub-windows: quantiles cover the last minute
)

// latBucket returns the bucket of a duration in microseconds.
func latBucket(us int64) int {
	if us <= 1 {
		return 0
	}
	// log2(us) in quarters: the integer part from the bit length, the
	// fraction from the next two bits below the leading one.
	n := bits.Len64(uint64(us)) - 1
	frac := 0
	if n >= 2 {
		frac = int(uint64(us)>>(n-2)) & 3
	} else {
		frac = int(uint64(us)<<(2-n)) & 3
	}
	b := n*latBucketsPerDoubling + frac
	return min(b, latBuckets-1)
}

// latUpper is the upper bound of bucket b in milliseconds.
func latUpper(b int) float64 {
	n := b / latBucketsPerDoubling
	frac := b % latBucketsPerDoubling
	us := math.Ldexp(1+float64(frac+1)/4, n)
	return us / 1000
}

// latWindow is a histogram of the last minute of latencies, kept as six
// ten-second histograms that are recycled in turn.
type latWindow struct {
	stamp [latWindows]int64
	h     [latWindows][latBuckets]uint32
}

func (w *latWindow) observe(now int64, d time.Duration) {
	epoch := now / latWindowSpan
	i := epoch % latWindows
	if w.stamp[i] != epoch {
		w.stamp[i] = epoch
		w.h[i] = [latBuckets]uint32{}
	}
	w.h[i][latBucket(d.Microseconds())]++
}

// quantiles returns the given quantiles (0..1) in milliseconds over the
// last minute, 0 when nothing was observed.
func (w *latWindow) quantiles(now int64, qs ...float64) []float64 {
	epoch := now / latWindowSpan
	var sum [latBuckets]uint64
	var total uint64
	for i := range latWindows {
		if epoch-w.stamp[i] >= latWindows || w.stamp[i] > epoch {
			continue
		}
		for b, c := range w.h[i] {
			sum[b] += uint64(c)
			total += uint64(c)
		}
	}
	out := make([]float64, len(qs))
	if total == 0 {
		return out
	}
	for qi, q := range qs {
		want := uint64(math.Ceil(q * float64(total)))
		want = max(want, 1)
		var cum uint64
		for b, c := range sum {
			cum += c
			if cum >= want {
				out[qi] = math.Round(latUpper(b)*1000) / 1000
				break
			}
		}
	}
	return out
}

// ruleStats is one rule's per-second counters and latency window.
type ruleStats struct {
	mu     sync.Mutex
	series series
	lat    latWindow
	last   int64 // the last second with a decision
}

// stats holds this instance's counters, per rule, for the dashboard and
// the fleet view.
type stats struct {
	mu    sync.RWMutex
	rules map[string]*ruleStats

	storeMu  sync.Mutex
	storeLat latWindow
}

func newStats() *stats { return &stats{rules: make(map[string]*ruleStats)} }

func (s *stats) rule(name string) *ruleStats {
	s.mu.RLock()
	rs := s.rules[name]
	s.mu.RUnlock()
	if rs != nil {
		return rs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rs = s.rules[name]; rs == nil {
		rs = &ruleStats{}
		s.rules[name] = rs
	}
	return rs
}

// record counts one decision of rule at now, made by the on_error fallback
// if fallback, near its limit if near, with its store latency when the
// store was asked (lat ≥ 0).
func (s *stats) record(rule string, now time.Time, outcome int, fallback, near bool, lat time.Duration) {
	sec := now.Unix()
	rs := s.rule(rule)
	rs.mu.Lock()
	rs.series.add(sec, outcome, 1)
	if fallback {
		rs.series.add(sec, outFallback, 1)
	}
	if near {
		rs.series.add(sec, outNearLimit, 1)
	}
	rs.last = sec
	if lat >= 0 {
		rs.lat.observe(sec, lat)
	}
	rs.mu.Unlock()
	if lat >= 0 {
		s.storeMu.Lock()
		s.storeLat.observe(sec, lat)
		s.storeMu.Unlock()
	}
}

// observeStore records a store call that no rule's counters see.
func (s *stats) observeStore(now time.Time, lat time.Duration) {
	s.storeMu.Lock()
	s.storeLat.observe(now.Unix(), lat)
	s.storeMu.Unlock()
}

// names returns the rules with counters.
func (s *stats) names() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.rules))
	for n := range s.rules {
		out = append(out, n)
	}
	return out
}

// window copies rule's counters for the seconds from, from+1, … from+n-1.
func (s *stats) window(rule string, from int64, n int) []counts {
	out := make([]counts, n)
	s.mu.RLock()
	rs := s.rules[rule]
	s.mu.RUnlock()
	if rs == nil {
		return out
	}
	rs.mu.Lock()
	for i := range out {
		out[i] = rs.series.get(from + int64(i))
	}
	rs.mu.Unlock()
	return out
}

// latency returns rule's p50 and p99 store latency over the last minute.
func (s *stats) latency(rule string, now time.Time) (p50, p99 float64) {
	s.mu.RLock()
	rs := s.rules[rule]
	s.mu.RUnlock()
	if rs == nil {
		return 0, 0
	}
	rs.mu.Lock()
	q := rs.lat.quantiles(now.Unix(), 0.5, 0.99)
	rs.mu.Unlock()
	return q[0], q[1]
}

// storeLatency returns the store's p50 and p99 latency over the last minute.
func (s *stats) storeLatency(now time.Time) (p50, p99 float64) {
	s.storeMu.Lock()
	q := s.storeLat.quantiles(now.Unix(), 0.5, 0.99)
	s.storeMu.Unlock()
	return q[0], q[1]
}

// prune forgets rules that are not in keep and saw no decision in the
// whole window, so that rules removed from the config age out.
func (s *stats) prune(now time.Time, keep map[string]bool) {
	cutoff := now.Unix() - seriesLen
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, rs := range s.rules {
		if keep[name] {
			continue
		}
		rs.mu.Lock()
		old := rs.last < cutoff
		rs.mu.Unlock()
		if old {
			delete(s.rules, name)
		}
	}
}
