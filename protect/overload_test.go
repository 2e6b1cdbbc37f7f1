package protect

import (
	"container/heap"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// overloadSim drives an adaptive rule with nothing but a reserve (no
// MaxWait) on an injected clock: a backend that serves every admitted
// request in exactly service, critical requests arriving evenly at
// critRate per second, and a flood of normal and sheddable requests. A
// critical request the limit refuses waits through Enqueue, and is
// withdrawn when the MaxWait in force at its arrival has passed.
type overloadSim struct {
	t       *testing.T
	clock   *fakeClock
	r       *Rule
	service time.Duration
	events  evHeap
	seq     int

	offered, admitted [NumPriorities]int
	// counted: critical requests arriving once the limit had measured
	// its latency; critShed: those of them shed; countedAt: when they
	// arrived.
	counted, critShed int
	countedAt         []time.Time
	maxQueue, limit   int
}

type ev struct {
	at  time.Time
	seq int
	fn  func()
}

type evHeap []ev

func (h evHeap) Len() int { return len(h) }
func (h evHeap) Less(i, j int) bool {
	return h[i].at.Before(h[j].at) || h[i].at.Equal(h[j].at) && h[i].seq < h[j].seq
}
func (h evHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *evHeap) Push(x any)   { *h = append(*h, x.(ev)) }
func (h *evHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func (s *overloadSim) at(d time.Duration, fn func()) {
	s.seq++
	heap.Push(&s.events, ev{at: s.clock.Now().Add(d), seq: s.seq, fn: fn})
}

func (s *overloadSim) run(until time.Time) {
	for s.events.Len() > 0 {
		e := heap.Pop(&s.events).(ev)
		if e.at.After(until) {
			return
		}
		s.clock.Advance(e.at.Sub(s.clock.Now()))
		e.fn()
		s.r.mu.Lock()
		q := len(s.r.waiters)
		s.r.mu.Unlock()
		s.maxQueue = max(s.maxQueue, q)
		if q > s.limit {
			s.t.Fatalf("%d critical requests wait under a limit of %d", q, s.limit)
		}
		s.r.mu.Lock()
		inflight, n := s.r.lim.inflight, s.r.effectiveLimit(s.clock.Now(), Critical)
		s.r.mu.Unlock()
		if q > 0 && inflight < n {
			s.t.Fatalf("%d critical requests wait while %d of %d slots are taken", q, inflight, n)
		}
	}
}

// serve runs an admitted request for the backend's service time.
func (s *overloadSim) serve(p Priority, tk Ticket) {
	s.admitted[p]++
	s.at(s.service, func() { tk.Done(false) })
}

func (s *overloadSim) arrive(p Priority) {
	s.offered[p]++
	if p != Critical {
		s.r.mu.Lock()
		q := len(s.r.waiters)
		s.r.mu.Unlock()
		if tk, err := s.r.Acquire(p); err == nil {
			if q > 0 {
				s.t.Fatalf("a %v request took a slot while %d critical requests waited", p, q)
			}
			s.serve(p, tk)
		}
		return
	}
	bound := s.r.MaxWait()
	counted := bound > 0
	if counted {
		s.counted++
		s.countedAt = append(s.countedAt, s.clock.Now())
	}
	arrived := s.clock.Now()
	tk, cancel, err := s.r.Enqueue(Critical, func(tk Ticket, err error) {
		if waited := s.clock.Now().Sub(arrived); waited > bound {
			s.t.Fatalf("a critical request got a slot after waiting %v, past its bound %v", waited, bound)
		}
		if err != nil {
			s.t.Fatalf("granted with %v", err)
		}
		// granted runs under the rule's lock: start the request next.
		s.at(0, func() { s.serve(Critical, tk) })
	})
	switch {
	case cancel != nil:
		s.at(bound, func() {
			if cancel() && counted {
				s.critShed++
			}
		})
	case err != nil:
		if counted {
			s.critShed++
		}
	default:
		s.serve(Critical, tk)
	}
}

// newOverloadSim offers, for dur, critical requests at critShare of the
// backend's capacity and a flood of others at flood × capacity, 40% of
// them sheddable.
func newOverloadSim(t *testing.T, critShare, flood float64, dur time.Duration) *overloadSim {
	const limit = 20
	clock := newClock()
	s := &overloadSim{t: t, clock: clock, service: 10 * time.Millisecond, limit: limit}
	// Every request takes the same time, so the adaptive limit sees no
	// queue and stays at its ceiling, the backend's capacity, but for its
	// probes (every ProbeInterval it halves to measure the latency).
	s.r = mustRule(t, Config{Name: "api", Adaptive: true, MaxConcurrency: limit,
		InitialConcurrency: limit, Reserve: 0.2, Now: clock.Now})
	capacity := float64(limit) / s.service.Seconds() // per second
	end := clock.Now().Add(dur)
	every := func(rate float64, fn func()) {
		gap := time.Duration(float64(time.Second) / rate)
		var tick func()
		tick = func() {
			fn()
			if clock.Now().Add(gap).Before(end) {
				s.at(gap, tick)
			}
		}
		s.at(gap, tick)
	}
	if critShare > 0 {
		every(critShare*capacity, func() { s.arrive(Critical) })
	}
	n := 0
	every(flood*capacity, func() {
		n++
		if n%5 < 2 {
			s.arrive(Sheddable)
		} else {
			s.arrive(Normal)
		}
	})
	s.run(end.Add(time.Second))
	return s
}

// TestCriticalNeverShedBelowCapacity: under a flood of normal and
// sheddable requests, with nothing but an adaptive limit and a reserve
// configured, no critical request is shed while critical demand stays
// below the backend's capacity (half of it, and 90% of it, so well past
// the 20% reserve), probes of the limit included; sheddable requests are
// shed before normal ones, and no waiting request gets a slot past its
// wait.
func TestCriticalNeverShedBelowCapacity(t *testing.T) {
	for _, share := range []float64{0.5, 0.9} {
		s := newOverloadSim(t, share, 3, 12*time.Second) // two probes
		st := s.r.Stats()
		if s.counted < int(share*2000*11) {
			t.Fatalf("critical share %.1f: only %d critical requests counted; the latency was never measured", share, s.counted)
		}
		if s.critShed != 0 || st.Shed[Critical] > uint64(s.offered[Critical]-s.counted) {
			t.Fatalf("critical share %.1f: %d of %d critical requests shed after the latency was measured (stats %+v)",
				share, s.critShed, s.counted, st)
		}
		if share > 0.8 && s.maxQueue == 0 {
			t.Fatalf("critical share %.1f: no critical request ever waited: the flood did not fill the limit", share)
		}
		// Sheddable requests are shed first: a smaller share of them gets in.
		shedIn := float64(s.admitted[Sheddable]) / float64(s.offered[Sheddable])
		normIn := float64(s.admitted[Normal]) / float64(s.offered[Normal])
		if st.Shed[Normal] == 0 || shedIn >= normIn {
			t.Fatalf("critical share %.1f: sheddable admitted %.3f of offered, normal %.3f (shed %v)", share, shedIn, normIn, st.Shed)
		}
		if st.InFlight != 0 {
			t.Fatalf("critical share %.1f: %d still in flight at the end", share, st.InFlight)
		}
	}
}

// idealServed is how many of the critical requests arriving at times
// (in order) an ideal queue serves: one that serves nothing but critical
// requests, first come first served, on servers that each take service
// per request, a request leaving when it has waited longer than wait.
func idealServed(arrivals []time.Time, servers int, service, wait time.Duration) int {
	free := make([]time.Time, servers) // when each server is next free
	served := 0
	for _, at := range arrivals {
		i := 0
		for j := range free {
			if free[j].Before(free[i]) {
				i = j
			}
		}
		start := at
		if free[i].After(at) {
			start = free[i]
		}
		if start.Sub(at) > wait {
			continue
		}
		free[i] = start.Add(service)
		served++
	}
	return served
}

// TestCriticalAtCapacityAsIdealQueue: with critical demand at the
// backend's whole capacity, Poisson arrivals, under four times that of
// normal and sheddable requests (five times the capacity in all), the
// rule serves as many critical requests as an ideal queue that serves
// critical requests only, first come first served, each waiting at most
// the unloaded latency, on the same arrivals: no slot idles and no other
// request takes one while a critical request waits (overloadSim checks
// both after every event). Demand at capacity makes the queue's length a
// random walk with no drift, so even the ideal queue sheds some: about
// the variance of the arrivals over twice the queue's length.
func TestCriticalAtCapacityAsIdealQueue(t *testing.T) {
	const limit = 20
	var shares []float64
	for seed := range uint64(5) {
		clock := newClock()
		s := &overloadSim{t: t, clock: clock, service: 10 * time.Millisecond, limit: limit}
		s.r = mustRule(t, Config{Name: "api", Adaptive: true, MaxConcurrency: limit,
			InitialConcurrency: limit, Reserve: 0.2, Now: clock.Now})
		capacity := float64(limit) / s.service.Seconds()
		end := clock.Now().Add(5 * time.Second)
		rng := rand.New(rand.NewPCG(seed, 1))
		poisson := func(rate float64, fn func()) {
			gap := func() time.Duration { return time.Duration(rng.ExpFloat64() / rate * float64(time.Second)) }
			var tick func()
			tick = func() {
				fn()
				if g := gap(); clock.Now().Add(g).Before(end) {
					s.at(g, tick)
				}
			}
			s.at(gap(), tick)
		}
		poisson(capacity, func() { s.arrive(Critical) })
		poisson(4*capacity, func() {
			if rng.Float64() < 0.375 {
				s.arrive(Sheddable)
			} else {
				s.arrive(Normal)
			}
		})
		s.run(end.Add(time.Second))
		served := s.counted - s.critShed
		ideal := idealServed(s.countedAt, limit, s.service, s.service)
		share, idealShare := float64(served)/float64(s.counted), float64(ideal)/float64(s.counted)
		t.Logf("seed %d: %d critical requests, %.2f%% served, the ideal queue %.2f%%", seed, s.counted, share*100, idealShare*100)
		if s.counted < int(capacity*4.5) {
			t.Fatalf("seed %d: only %d critical requests counted", seed, s.counted)
		}
		// A probe's first calls, which the ideal queue does not have,
		// cost the rule a few.
		if share < idealShare-0.002 {
			t.Fatalf("seed %d: %.2f%% of critical requests served, the ideal queue serves %.2f%%", seed, share*100, idealShare*100)
		}
		if s.admitted[Normal]+s.admitted[Sheddable] > s.admitted[Critical]/20 {
			t.Fatalf("seed %d: admitted %v: critical requests were not served first", seed, s.admitted)
		}
		shares = append(shares, share)
	}
	slices.Sort(shares)
	t.Logf("critical served: min %.2f%%, median %.2f%%, max %.2f%%", shares[0]*100, shares[len(shares)/2]*100, shares[len(shares)-1]*100)
}

// TestCriticalQueueBounded: critical demand at three times the capacity
// sheds critical requests rather than queueing them without end: at most
// the limit's worth wait, none past its wait.
func TestCriticalQueueBounded(t *testing.T) {
	s := newOverloadSim(t, 3, 1, 3*time.Second)
	if s.critShed == 0 || s.maxQueue == 0 || s.maxQueue > s.limit {
		t.Fatalf("critical shed %d, longest queue %d (limit %d)", s.critShed, s.maxQueue, s.limit)
	}
	// Almost the whole capacity goes to critical requests.
	if s.admitted[Normal]+s.admitted[Sheddable] > s.admitted[Critical]/20 {
		t.Fatalf("admitted %v: critical requests were not served first", s.admitted)
	}
}

// TestMaxWaitFollowsLatency: without a MaxWait, an adaptive limit lets a
// critical request wait as long as its measured unloaded latency, and
// not at all before it has measured one; a fixed limit never waits, and a
// configured MaxWait wins.
func TestMaxWaitFollowsLatency(t *testing.T) {
	clock := newClock()
	r := mustRule(t, Config{Name: "api", Adaptive: true, InitialConcurrency: 4, Now: clock.Now})
	if w := r.MaxWait(); w != 0 {
		t.Fatalf("MaxWait before any latency was measured: %v, want 0", w)
	}
	var tks []Ticket
	for range 4 {
		tk, err := r.Acquire(Normal)
		if err != nil {
			t.Fatal(err)
		}
		tks = append(tks, tk)
	}
	if _, cancel, err := r.Enqueue(Critical, func(Ticket, error) {}); cancel != nil || err == nil {
		t.Fatal("a critical request queued before the latency was measured")
	}
	clock.Advance(7 * time.Millisecond)
	for i := range tks {
		tks[i].Done(false)
	}
	if w, base := r.MaxWait(), r.Stats().BaseRTT; w != 7*time.Millisecond || base != w {
		t.Fatalf("MaxWait %v with a measured latency of %v, want 7ms", w, base)
	}
	r2 := mustRule(t, Config{Name: "api", Adaptive: true, MaxWait: time.Second, Now: clock.Now})
	if w := r2.MaxWait(); w != time.Second {
		t.Fatalf("MaxWait with max_wait 1s: %v", w)
	}
	r3 := mustRule(t, Config{Name: "api", Concurrency: 5, Now: clock.Now})
	if w := r3.MaxWait(); w != 0 {
		t.Fatalf("MaxWait of a fixed limit: %v", w)
	}
}

// TestProbeUnderLightLoad: a probe under a light load, one call at a time
// far under the limit, still measures the latency (a backend that became
// slower), rather than being given up as one that critical requests keep
// from draining.
func TestProbeUnderLightLoad(t *testing.T) {
	clock := newClock()
	r := mustRule(t, Config{Name: "api", Adaptive: true, InitialConcurrency: 100, MaxConcurrency: 200, Now: clock.Now})
	call := func(d time.Duration) {
		tk, err := r.Acquire(Normal)
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(d)
		tk.Done(false)
	}
	for range 100 {
		call(10 * time.Millisecond)
	}
	if base := r.Stats().BaseRTT; base != 10*time.Millisecond {
		t.Fatalf("baseline %v, want 10ms", base)
	}
	for range 1000 { // 15 s of calls taking 15ms: probes come due
		call(15 * time.Millisecond)
	}
	if base := r.Stats().BaseRTT; base != 15*time.Millisecond {
		t.Fatalf("baseline %v after the backend became slower, want 15ms", base)
	}
}
