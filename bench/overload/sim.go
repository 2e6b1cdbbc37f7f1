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
// worker for service × a lognormal factor (median 1, -jitter its sigma).

type simEvent struct {
	at   time.Time
	seq  int
	kind int // 0 arrival, 1 done, 2 timeout in line, 3 slot granted, 4 wait over
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
	rng         *rand.Rand
	events      simHeap
	seq         int
	rate        float64
	measureFrom time.Time
	end         time.Time
	busy        int
	line        []*simReq
	res         result
}

// simulate runs mode at rate requests per second in virtual time.
func simulate(mode string, rate float64) (result, string) {
	s := &simRun{now: time.Unix(1_700_000_000, 0), rng: rand.New(rand.NewPCG(*seed, 2)), rate: rate}
	s.rule = simRule(mode, func() time.Time { return s.now })
	s.measureFrom = s.now.Add(*warmup)
	s.end = s.measureFrom.Add(*duration)
	s.push(s.now, 0, nil)
	for s.events.Len() > 0 {
		e := heap.Pop(&s.events).(simEvent)
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
		r.tk.Done(true) // the handler's 504
		s.finish(r, false)
	case 3: // a waiting critical request got a slot
		if e.err != nil {
			s.finish(r, false)
			return
		}
		r.tk = e.tk
		s.admitted(r)
	case 4: // a critical request waited max_wait
		if r.cancel() {
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
	if s.rule == nil {
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
		r.cancel = cancel
		s.push(s.now.Add(bound), 4, r)
	case err != nil:
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
	f := math.Exp(s.rng.NormFloat64() * *jitter)
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
		}
	}
}
