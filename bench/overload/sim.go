package main

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/weir-dev/weir/protect"
)

// The simulation: the same backend and load as the wall-clock run, on a
// virtual clock, so that its figures do not depend on the machine. Each
// arrival goes through a protect.Rule configured as the wall-clock run's
// policy configures it, on the virtual clock (Enqueue, so that a critical
// request can wait for a slot without blocking the loop); an admitted
// request waits in the backend's line for one of capacity workers, or
// gives up after timeout (a 504 the rule counts as a failure), and holds a
// worker for service × a lognormal factor (mean 1, so that the capacity is
// what the load is a multiple of; -jitter its sigma). Arrivals and service
// times come from two streams of -seed, so every mode sees the same
// arrivals.
//
// The "ideal" mode is the yardstick of critical requests served: no rule,
// normal and sheddable requests all turned away, critical ones served
// first come first served, each waiting at most -ideal-wait (default
// -service, the unloaded latency) for a worker.

type simEvent struct {
	at   time.Time
	seq  int
	kind int // 0 arrival, 1 done, 2 timeout in line, 3 slot granted, 4 wait over, 5 ideal: wait over
	req  *simReq
	tk   protect.Ticket
	err  error
}

type simReq struct {
	arrived   time.Time
	critical  bool
	sheddable bool
	measured  bool
	tk        protect.Ticket
	cancel    func() bool // while waiting for a slot
	started   bool        // got a worker
	finished  bool
	cause     string // why a critical request was lost
}

type simHeap []simEvent

func (h simHeap) Len() int { return len(h) }
func (h simHeap) Less(i, j int) bool {
	return h[i].at.Before(h[j].at) || h[i].at.Equal(h[j].at) && h[i].seq < h[j].seq
}
func (h simHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simHeap) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *simHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// simRule builds mode's protect rule, as modeConfig's policy does, on the
// virtual clock; nil for none.
func simRule(mode string, now func() time.Time) *protect.Rule {
	cfg := protect.Config{Name: "api", Reserve: 0.2, Adaptive: true, Now: now}
	switch mode {
	case "adaptive+max_wait":
		cfg.MaxWait = *maxWait
	case "adaptive":
	default:
		return nil
	}
	r, err := protect.New(cfg)
	if err != nil {
		panic(err)
	}
	return r
}

// simRun is one simulation's state.
type simRun struct {
	now         time.Time
	rule        *protect.Rule // nil: no protection
	rng         *rand.Rand    // arrivals
	svc         *rand.Rand    // service times: the same arrivals in every mode
	ideal       bool          // no rule: critical requests only, FIFO, each waiting at most -service
	events      simHeap
	seq         int
	rate        float64
	measureFrom time.Time
	end         time.Time
	busy        int
	line        []*simReq
	res         result
	waiting     int // critical requests waiting for a slot
}

// simulate runs mode at rate requests per second in virtual time.
func simulate(mode string, rate float64) (result, string) { return simulateSeed(mode, rate, *seed) }

// simulateSeed is simulate with the given seed.
func simulateSeed(mode string, rate float64, seed uint64) (result, string) {
	s := &simRun{now: time.Unix(1_700_000_000, 0), rng: rand.New(rand.NewPCG(seed, 2)),
		svc: rand.New(rand.NewPCG(seed, 3)), rate: rate, ideal: mode == "ideal"}
	s.rule = simRule(mode, func() time.Time { return s.now })
	if *trace {
		s.res.lost = map[string]int{}
	}
	s.measureFrom = s.now.Add(*warmup)
	s.end = s.measureFrom.Add(*duration)
	s.push(s.now, 0, nil)
	for s.events.Len() > 0 {
		e := heap.Pop(&s.events).(simEvent)
		if s.res.lost != nil && !s.now.Before(s.measureFrom) && s.now.Before(s.end) {
			idle := e.at.Sub(s.now).Seconds() * float64(*capacity-s.busy)
			s.res.idle += idle
			if s.waiting > 0 {
				s.res.idleWaiting += idle
			}
		}
		s.now = e.at
		s.handle(e)
	}
	if s.rule == nil {
		return s.res, "–"
	}
	return s.res, fmt.Sprint(s.rule.Stats().Limit)
}

func (s *simRun) push(at time.Time, kind int, r *simReq) {
	s.seq++
	heap.Push(&s.events, simEvent{at: at, seq: s.seq, kind: kind, req: r})
}

func (s *simRun) handle(e simEvent) {
	r := e.req
	switch e.kind {
	case 0:
		s.arrive()
	case 1: // a worker done
		s.busy--
		r.tk.Done(false)
		s.finish(r, s.now.Sub(r.arrived) <= *timeout)
		for s.busy < *capacity && len(s.line) > 0 {
			next := s.line[0]
			s.line = s.line[1:]
			if !next.finished {
				s.startWork(next)
			}
		}
	case 2: // a client gives up while in line
		if r.started || r.finished {
			return
		}
		r.cause = "client timeout in the backend's line"
		r.tk.Done(true) // the handler's 504
		s.finish(r, false)
	case 3: // a waiting critical request got a slot
		s.waiting--
		if e.err != nil {
			s.finish(r, false)
			return
		}
		r.tk = e.tk
		s.admitted(r)
	case 5: // ideal: a critical request waited -ideal-wait in line
		if !r.started && !r.finished {
			r.cause = "waited max_wait"
			s.finish(r, false)
		}
	case 4: // a critical request waited max_wait
		if r.cancel() {
			s.waiting--
			r.cause = "waited max_wait"
			s.finish(r, false)
		}
	}
}

// arrive handles an arrival, and schedules the next.
func (s *simRun) arrive() {
	if next := s.now.Add(time.Duration(s.rng.ExpFloat64() / s.rate * float64(time.Second))); next.Before(s.end) {
		s.push(next, 0, nil)
	}
	u := s.rng.Float64()
	r := &simReq{arrived: s.now, critical: u < *critical, sheddable: u >= *critical && u < *critical+*sheddable, measured: !s.now.Before(s.measureFrom)}
	switch {
	case s.ideal && !r.critical:
		s.finish(r, false)
		return
	case s.ideal && s.busy < *capacity:
		s.startWork(r)
		return
	case s.ideal:
		s.line = append(s.line, r)
		w := *idealWait
		if w == 0 {
			w = *service
		}
		s.push(s.now.Add(w), 5, r)
		return
	case s.rule == nil:
		s.admitted(r)
		return
	}
	prio := protect.Normal
	switch {
	case r.critical:
		prio = protect.Critical
	case r.sheddable:
		prio = protect.Sheddable
	}
	bound := s.rule.MaxWait()
	tk, cancel, err := s.rule.Enqueue(prio, func(tk protect.Ticket, err error) {
		s.seq++
		heap.Push(&s.events, simEvent{at: s.now, seq: s.seq, kind: 3, req: r, tk: tk, err: err})
	})
	switch {
	case cancel != nil:
		s.waiting++
		r.cancel = cancel
		s.push(s.now.Add(bound), 4, r)
	case err != nil:
		r.cause = "shed at arrival"
		if bound == 0 {
			r.cause = "shed at arrival, no wait yet"
		}
		s.finish(r, false)
	default:
		r.tk = tk
		s.admitted(r)
	}
}

// admitted sends r to a free worker, or into the line.
func (s *simRun) admitted(r *simReq) {
	if s.busy < *capacity {
		s.startWork(r)
		return
	}
	s.line = append(s.line, r)
	s.push(s.now.Add(*timeout), 2, r)
}

func (s *simRun) startWork(r *simReq) {
	r.started = true
	s.busy++
	f := math.Exp(s.svc.NormFloat64()**jitter - *jitter**jitter/2)
	s.push(s.now.Add(time.Duration(float64(*service)*f)), 1, r)
}

func (s *simRun) finish(r *simReq, ok bool) {
	r.finished = true
	if !r.measured {
		return
	}
	s.res.offered++
	if r.critical {
		s.res.critOffered++
	}
	if ok {
		s.res.ok++
		s.res.lat = append(s.res.lat, s.now.Sub(r.arrived))
		if r.critical {
			s.res.critOK++
		} else {
			s.res.otherOK++
		}
	} else if r.critical && s.res.lost != nil {
		s.res.lost[r.cause]++
	}
}
