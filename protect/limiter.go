package protect

import (
	"math"
	"time"
)

// limiter is a rule's concurrency limit, fixed or adaptive; its owner's
// mutex guards it.
//
// The adaptive limit follows TCP Vegas. It keeps baseRTT, the latency of
// calls that met no queue, and every round (half the limit's worth of
// calls) compares the round's mean latency with it: the calls queued
// behind the backend's capacity are estimated as
//
//	queue = limit × (1 − baseRTT / mean)
//
// Only a round that used at least half of the limit moves it: below
// alpha = 3·log10(limit) the limit grows by log10(limit), above
// beta = 6·log10(limit) it falls by half the excess over alpha; calls
// admitted before a fall do not count in the rounds after it, since they
// met the queue the old limit let build. Every ProbeInterval the limit
// halves (for all but critical requests) until a halved limit's worth of
// calls have run with in flight under it, and their mean latency becomes
// baseRTT: as BBR's ProbeRTT does, this forgets a baseline that a slower
// backend made stale and, since the probe's calls meet no queue, does not
// let the baseline creep up with the queue. Taking the mean of a whole
// halved limit's calls, not of the first few to finish, keeps it from
// favouring the fast ones. Only probes set baseRTT: the least of the
// rounds' means, the least of many noisy means, sat 5–10% below the
// latency (a backend that became faster makes the queue estimate
// negative, and the limit grows, until the next probe). A probe that
// critical requests keep from draining (after 4 × baseRTT, more calls
// done above its limit than under it) is given up, as is one not done in
// ProbeInterval.
type limiter struct {
	fixed    int // a fixed limit; 0 when adaptive or none
	adaptive bool
	lo, hi   int
	limit    float64 // adaptive
	inflight int

	baseRTT    time.Duration // 0: unknown
	interval   time.Duration
	nextProbe  time.Time
	probing    bool
	probeEnd   time.Time // a probe not done by then is given up
	probeLimit int
	probeSum   time.Duration
	probeN     int
	probeSkip  int // calls done in the probe that it cannot count

	roundSum time.Duration
	roundN   int
	roundMax int // most in flight at an admission this round
	// cut is when the limit last fell: calls admitted before it met the
	// queue the old limit let build, and do not count in a round.
	cut time.Time
}

// configure applies c, keeping the requests in flight and, when the limit
// stays adaptive, what it learned.
func (l *limiter) configure(c *Config, now time.Time) {
	l.fixed = c.Concurrency
	wasAdaptive := l.adaptive
	l.adaptive = c.Adaptive
	l.lo, l.hi = c.bounds()
	l.interval = c.ProbeInterval
	if l.interval == 0 {
		l.interval = DefaultProbeInterval
	}
	if !l.adaptive {
		return
	}
	if !wasAdaptive {
		init := c.InitialConcurrency
		if init == 0 {
			init = DefaultInitialConcurrency
		}
		l.limit = float64(init)
		// The first calls, at the initial limit, measure the baseline.
		l.startProbe(now, max(init, 1))
	}
	l.limit = min(max(l.limit, float64(l.lo)), float64(l.hi))
}

// current returns the limit in force; 0 means none.
func (l *limiter) current() int {
	switch {
	case l.adaptive && l.probing:
		return l.probeLimit
	case l.adaptive:
		return int(l.limit)
	}
	return l.fixed
}

// threshold is how many may be in flight when a request of priority p is
// admitted under limit n: critical requests may fill it, normal ones stop
// at the reserve, and sheddable ones a tenth below that.
func threshold(n int, reserve float64, p Priority) int {
	if p == Critical {
		return n
	}
	n -= int(float64(n) * reserve)
	if p == Sheddable {
		n -= n / 10
	}
	return n
}

func (l *limiter) startProbe(now time.Time, n int) {
	l.probing = true
	l.probeLimit = n
	l.probeSum, l.probeN, l.probeSkip = 0, 0, 0
	l.nextProbe = now.Add(l.interval)
	l.probeEnd = now.Add(4 * l.baseRTT)
}

// sample takes the latency of a call that was admitted with before others
// in flight.
func (l *limiter) sample(now time.Time, rtt time.Duration, before int) {
	if !l.adaptive {
		return
	}
	rtt = max(rtt, time.Microsecond)
	if l.probing {
		if l.baseRTT > 0 && (now.After(l.probeEnd) && l.probeSkip > l.probeN || !now.Before(l.nextProbe)) {
			// Critical requests, which a probe does not hold back, kept
			// in flight above the probe's limit (or a light load took
			// a whole interval to finish it): keep the baseline.
			l.probing = false
			l.roundSum, l.roundN, l.roundMax = 0, 0, 0
			return
		}
		if before >= l.probeLimit {
			l.probeSkip++
			return // admitted before the drain: it may have queued
		}
		l.probeSum += rtt
		l.probeN++
		if l.probeN >= max(1, l.probeLimit) {
			l.baseRTT = l.probeSum / time.Duration(l.probeN)
			l.probing = false
			l.roundSum, l.roundN, l.roundMax = 0, 0, 0
		}
		return
	}
	if now.Add(-rtt).Before(l.cut) {
		return
	}
	l.roundSum += rtt
	l.roundN++
	l.roundMax = max(l.roundMax, before+1)
	if l.roundN < max(1, int(l.limit)/2) {
		return
	}
	mean := l.roundSum / time.Duration(l.roundN)
	used := l.roundMax
	l.roundSum, l.roundN, l.roundMax = 0, 0, 0
	lg := max(1, math.Log10(l.limit))
	queue := l.limit * (1 - float64(l.baseRTT)/float64(mean))
	alpha, beta := 3*lg, 6*lg
	switch {
	case float64(used) < l.limit/2:
		// The round left most of the limit unused: its latency, whatever
		// it was, came from elsewhere (a fast handler's scheduling noise,
		// a slow dependency), not from the requests this limit admits.
	case queue > beta:
		l.limit -= (queue - alpha) / 2
		l.cut = now
	case queue < alpha:
		l.limit += lg
	}
	l.limit = min(max(l.limit, float64(l.lo)), float64(l.hi))
	if !now.Before(l.nextProbe) {
		l.startProbe(now, max(l.lo, int(l.limit)/2))
	}
}
