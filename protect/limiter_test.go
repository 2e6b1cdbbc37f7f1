package protect

import (
	"container/heap"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPriorityThresholds: with a limit of 100 and reserve 20%, sheddable
// requests stop at 72 in flight, normal ones at 80 and critical ones at 100.
func TestPriorityThresholds(t *testing.T) {
	r := mustRule(t, Config{Name: "api", Concurrency: 100, Reserve: 0.2})
	var held []Ticket
	fill := func(p Priority) int {
		n := 0
		for {
			tk, err := r.Acquire(p)
			if err != nil {
				var rej *Rejection
				if !errors.As(err, &rej) || rej.Reason != ReasonOverloaded || rej.Rule != "api" || rej.Priority != p {
					t.Fatalf("rejection %#v", err)
				}
				return n
			}
			held = append(held, tk)
			n++
		}
	}
	if n := fill(Sheddable); n != 72 {
		t.Fatalf("sheddable admitted %d, want 72", n)
	}
	if n := fill(Normal); n != 8 {
		t.Fatalf("normal admitted %d more, want 8 (to 80)", n)
	}
	if n := fill(Critical); n != 20 {
		t.Fatalf("critical admitted %d more, want 20 (to 100)", n)
	}
	if _, err := r.Acquire(Sheddable); err == nil {
		t.Fatal("sheddable admitted at 100 in flight")
	}
	st := r.Stats()
	if st.InFlight != 100 || st.Shed != [NumPriorities]uint64{1 + 1, 1, 1} {
		t.Fatalf("stats %+v", st)
	}
	held[0].Done(false)
	if _, err := r.Acquire(Normal); err == nil {
		t.Fatal("normal admitted at 99 in flight, in the reserve")
	}
	if _, err := r.Acquire(Critical); err != nil {
		t.Fatalf("critical refused at 99 in flight: %v", err)
	}
}

// TestConcurrencyExact: many goroutines never get more than the limit in
// flight, and every slot comes back.
func TestConcurrencyExact(t *testing.T) {
	const limit = 16
	r := mustRule(t, Config{Name: "api", Concurrency: limit, Reserve: 0.25})
	var inFlight, peak, nonCritPeak, nonCrit atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := Priority(g % NumPriorities)
			for range 300 {
				tk, err := r.Acquire(p)
				if err != nil {
					continue
				}
				n := inFlight.Add(1)
				if p != Critical {
					if nc := nonCrit.Add(1); nc > 12 { // past the reserve line
						nonCritPeak.Store(nc)
					}
				}
				for old := peak.Load(); n > old && !peak.CompareAndSwap(old, n); old = peak.Load() {
				}
				inFlight.Add(-1)
				if p != Critical {
					nonCrit.Add(-1)
				}
				tk.Done(false)
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Fatalf("peak in flight %d over the limit %d", p, limit)
	}
	if n := nonCritPeak.Load(); n != 0 {
		t.Fatalf("%d non-critical requests in flight, past the reserve line 12", n)
	}
	if st := r.Stats(); st.InFlight != 0 {
		t.Fatalf("in flight %d after every request ended", st.InFlight)
	}
}

// TestPriorityUnderContention: on a saturated backend, the share of
// requests shed is highest for sheddable ones and lowest for critical ones,
// and critical requests are nearly all served.
func TestPriorityUnderContention(t *testing.T) {
	c := newClock()
	r := mustRule(t, Config{Name: "api", Concurrency: 50, Reserve: 0.2, Now: c.Now})
	sim := newSim(c, r, 50, 20*time.Millisecond, 1)
	sim.priority = func(i int) Priority {
		switch i % 10 {
		case 0, 1:
			return Critical
		case 2, 3, 4:
			return Sheddable
		}
		return Normal
	}
	sim.run(2500*3, 10*time.Second) // three times capacity
	st := r.Stats()
	rate := func(p Priority) float64 { return float64(st.Shed[p]) / float64(st.Shed[p]+st.Admitted[p]) }
	t.Logf("shed: sheddable %.3f normal %.3f critical %.4f", rate(Sheddable), rate(Normal), rate(Critical))
	if !(rate(Sheddable) > rate(Normal) && rate(Normal) > rate(Critical)) {
		t.Fatalf("shed shares not in priority order: sheddable %.3f normal %.3f critical %.4f", rate(Sheddable), rate(Normal), rate(Critical))
	}
	if rate(Critical) > 0.01 {
		t.Fatalf("critical shed %.4f, want at most 1%%", rate(Critical))
	}
}

// TestShadow: a shadow rule admits everything and counts what it would
// have shed.
func TestShadow(t *testing.T) {
	c := newClock()
	r := mustRule(t, Config{Name: "api", Concurrency: 2, Shadow: true, Now: c.Now,
		Breaker: &BreakerConfig{Errors: 1, MinRequests: 1}})
	var tks []Ticket
	for range 5 {
		tk, err := r.Acquire(Normal)
		if err != nil {
			t.Fatalf("shadow rule refused: %v", err)
		}
		tks = append(tks, tk)
	}
	for i := range tks {
		tks[i].Done(true)
	}
	st := r.Stats()
	if st.Shed[Normal] != 3 || st.InFlight != 0 || st.State != Open {
		t.Fatalf("shadow stats %+v: want 3 shed, 0 in flight, breaker open", st)
	}
	if err := call(t, r, c, 0, false); err != nil {
		t.Fatalf("shadow breaker refused: %v", err)
	}
	if st := r.Stats(); st.CircuitOpen != 1 {
		t.Fatalf("CircuitOpen %d, want 1 (counted, not refused)", st.CircuitOpen)
	}
}

// TestReconfigureKeepsInFlight: a reload that changes the limit keeps
// counting the requests admitted before it.
func TestReconfigureKeepsInFlight(t *testing.T) {
	r := mustRule(t, Config{Name: "api", Concurrency: 10})
	var tks []Ticket
	for range 8 {
		tk, _ := r.Acquire(Normal)
		tks = append(tks, tk)
	}
	if err := r.Reconfigure(Config{Name: "api", Concurrency: 9}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Acquire(Normal); err != nil {
		t.Fatalf("9th: %v", err)
	}
	if _, err := r.Acquire(Normal); err == nil {
		t.Fatal("10th admitted under a limit of 9 with 9 in flight")
	}
	if err := r.Reconfigure(Config{Name: "api", Concurrency: -1}); err == nil {
		t.Fatal("a negative concurrency was accepted")
	}
	for i := range tks {
		tks[i].Done(false)
	}
	if st := r.Stats(); st.InFlight != 1 || st.Limit != 9 {
		t.Fatalf("after the first 8 ended: %+v, want 1 in flight under 9", st)
	}
}

// TestAdaptiveConverges runs a simulated backend, on an injected clock,
// whose capacity changes mid-run: 50 workers, then 20, then 80, each call
// taking 20 ms of work, offered three times what it can serve. In each
// phase the adaptive limit must settle near the capacity: at or above it
// (goodput) and not far above it (queueing), and latency must stay near
// the unloaded 20 ms.
func TestAdaptiveConverges(t *testing.T) {
	c := newClock()
	r := mustRule(t, Config{Name: "api", Adaptive: true, MinConcurrency: 5, MaxConcurrency: 1000, Now: c.Now})
	sim := newSim(c, r, 50, 20*time.Millisecond, 2)
	for _, capacity := range []int{50, 20, 80} {
		sim.workers = capacity
		rate := 3 * capacity * 50 // 3× what capacity workers serve at 20 ms
		sim.run(rate, 10*time.Second)
		sim.resetStats()
		lo, hi, sum, n := 1<<30, 0, 0, 0
		sim.onTick = func() {
			l := r.Stats().Limit
			lo, hi, sum, n = min(lo, l), max(hi, l), sum+l, n+1
		}
		sim.run(rate, 10*time.Second)
		sim.onTick = nil
		mean := float64(sum) / float64(n)
		good := float64(sim.done) / 10 / float64(capacity*50)
		t.Logf("capacity %d: limit mean %.1f [%d, %d], goodput %.3f of capacity, mean latency %v, base %v",
			capacity, mean, lo, hi, good, sim.meanLatency(), r.Stats().BaseRTT)
		if mean < float64(capacity) || mean > 1.4*float64(capacity)+5 {
			t.Errorf("capacity %d: mean limit %.1f, want within [%d, %.0f]", capacity, mean, capacity, 1.4*float64(capacity)+5)
		}
		if good < 0.9 {
			t.Errorf("capacity %d: goodput %.3f of capacity, want at least 0.9", capacity, good)
		}
		if lat := sim.meanLatency(); lat > 30*time.Millisecond {
			t.Errorf("capacity %d: mean latency %v, want under 30ms (unloaded 20ms)", capacity, lat)
		}
	}
}

// TestBaselineUnbiased: calls whose service times vary (by 10%) around a
// mean of 20ms, at three times the capacity, leave the unloaded latency
// at that mean, not below it: a critical request's wait and the queue the
// limit estimates both follow it. (Taking the least of the rounds' means
// as the baseline drove it 5–10% low: the least of many noisy means.)
func TestBaselineUnbiased(t *testing.T) {
	for seed := range uint64(3) {
		c := newClock()
		r := mustRule(t, Config{Name: "api", Adaptive: true, Now: c.Now})
		sim := newSim(c, r, 50, 20*time.Millisecond, seed)
		sim.jitter = 0.1
		sim.run(3*50*50, time.Second)
		var sum time.Duration
		n := 0
		sim.onTick = func() { sum += r.Stats().BaseRTT; n++ }
		sim.run(3*50*50, 30*time.Second) // six probes
		// Each probe's mean of some 25 calls is itself off by about 2%.
		if base := sum / time.Duration(n); base < 19600*time.Microsecond || base > 20400*time.Microsecond {
			t.Fatalf("seed %d: unloaded latency %v on average, want 20ms ± 2%%", seed, base)
		}
	}
}

// sim is a discrete-event simulation of a backend with a fixed number of
// workers and a FIFO queue, behind a rule, on an injected clock.
type sim struct {
	c        *fakeClock
	r        *Rule
	workers  int
	service  time.Duration
	rng      *rand.Rand
	priority func(i int) Priority
	onTick   func() // every simulated millisecond
	// jitter, when set, is the sigma of a lognormal factor of mean 1 on
	// each call's service time.
	jitter float64

	busy   int
	queue  []job
	events eventHeap
	seq    int
	// since the last resetStats
	done       int
	latencySum time.Duration
}

type job struct {
	tk    Ticket
	start time.Time
}

type event struct {
	at   time.Time
	seq  int
	done *job // nil: an arrival
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	return h[i].at.Before(h[j].at) || h[i].at.Equal(h[j].at) && h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newSim(c *fakeClock, r *Rule, workers int, service time.Duration, seed uint64) *sim {
	return &sim{c: c, r: r, workers: workers, service: service, rng: rand.New(rand.NewPCG(seed, seed))}
}

func (s *sim) resetStats() { s.done, s.latencySum = 0, 0 }

// serviceTime is one call's service time.
func (s *sim) serviceTime() time.Duration {
	if s.jitter == 0 {
		return s.service
	}
	return time.Duration(float64(s.service) * math.Exp(s.rng.NormFloat64()*s.jitter-s.jitter*s.jitter/2))
}

func (s *sim) meanLatency() time.Duration {
	if s.done == 0 {
		return 0
	}
	return s.latencySum / time.Duration(s.done)
}

func (s *sim) push(at time.Time, j *job) {
	s.seq++
	heap.Push(&s.events, event{at: at, seq: s.seq, done: j})
}

// run offers rate requests per second, Poisson, for d of simulated time.
func (s *sim) run(rate int, d time.Duration) {
	end := s.c.Now().Add(d)
	next := s.c.Now()
	tick := s.c.Now()
	arrivals := 0
	for {
		gap := time.Duration(s.rng.ExpFloat64() / float64(rate) * float64(time.Second))
		if s.events.Len() == 0 || next.Before(s.events[0].at) {
			if !next.Before(end) {
				break
			}
			s.advance(next, &tick)
			p := Normal
			if s.priority != nil {
				p = s.priority(arrivals)
			}
			arrivals++
			tk, err := s.r.Acquire(p)
			next = next.Add(gap)
			if err != nil {
				continue
			}
			j := &job{tk: tk, start: s.c.Now()}
			if s.busy < s.workers {
				s.busy++
				s.push(s.c.Now().Add(s.serviceTime()), j)
			} else {
				s.queue = append(s.queue, *j)
			}
			continue
		}
		e := heap.Pop(&s.events).(event)
		s.advance(e.at, &tick)
		e.done.tk.Done(false)
		s.done++
		s.latencySum += s.c.Now().Sub(e.done.start)
		s.busy--
		for s.busy < s.workers && len(s.queue) > 0 {
			j := s.queue[0]
			s.queue = s.queue[1:]
			s.busy++
			s.push(s.c.Now().Add(s.serviceTime()), &j)
		}
	}
	s.advance(end, &tick)
}

// advance moves the clock to at, calling onTick every millisecond passed.
func (s *sim) advance(at time.Time, tick *time.Time) {
	for s.onTick != nil && !tick.After(at) {
		s.onTick()
		*tick = tick.Add(time.Millisecond)
	}
	if at.After(*tick) && s.onTick == nil {
		*tick = at
	}
	if d := at.Sub(s.c.Now()); d > 0 {
		s.c.Advance(d)
	}
}

// TestReconfigureKeepsAdaptive: a reload that keeps the limit adaptive
// keeps what it learned (clamped to new bounds), instead of starting over.
func TestReconfigureKeepsAdaptive(t *testing.T) {
	c := newClock()
	cfg := Config{Name: "api", Adaptive: true, Now: c.Now}
	r := mustRule(t, cfg)
	sim := newSim(c, r, 50, 20*time.Millisecond, 3)
	sim.run(2500*3, 5*time.Second)
	learned := r.Stats()
	if learned.Limit < 50 || learned.BaseRTT == 0 {
		t.Fatalf("did not learn: %+v", learned)
	}
	cfg.MaxConcurrency = 40
	if err := r.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Limit != 40 || st.BaseRTT != learned.BaseRTT {
		t.Fatalf("after lowering max_concurrency to 40: %+v", st)
	}
	cfg.MaxConcurrency = 0
	if err := r.Reconfigure(cfg); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Limit != 40 {
		t.Fatalf("after lifting the ceiling: limit %d, want 40 kept (not the initial 20)", st.Limit)
	}
}

// TestAdaptiveIdleHolds: a fast handler under light load, whose latency
// jumps by 20× from scheduling noise, never fills half its limit, so the
// limit holds instead of shrinking towards its floor.
func TestAdaptiveIdleHolds(t *testing.T) {
	c := newClock()
	r := mustRule(t, Config{Name: "api", Adaptive: true, Now: c.Now})
	for i := range 5000 {
		tk, err := r.Acquire(Normal)
		if err != nil {
			t.Fatalf("request %d shed at one in flight: %v", i, err)
		}
		rtt := 5 * time.Microsecond
		if i%3 == 0 {
			rtt = 100 * time.Microsecond
		}
		c.Advance(rtt)
		tk.Done(false)
		c.Advance(time.Millisecond)
	}
	if st := r.Stats(); st.Limit != DefaultInitialConcurrency {
		t.Fatalf("limit %d after light, noisy load, want %d held", st.Limit, DefaultInitialConcurrency)
	}
}
