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
	arrived  time.Time
	critical bool
	measured bool
	tk       protect.Ticket
	cancel   func() bool // while waiting for a slot
	started  bool        // got a worker
	finished bool
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
	cfg := protect.Config{Name: "api", Reserve: 0.2, MaxWait: *maxWait, Now: now}
	switch mode {
	case "fixed":
		cfg.Concurrency = *capacity
	case "adaptive":
		cfg.Adaptive, cfg.MaxConcurrency = true, 1000
	default:
		return nil
	}
	r, err := protect.New(cfg)
	if err != nil {
		panic(err)
	}
	return r
}

// simulate runs mode at rate requests per second in virtual time.
func simulate(mode string, rate float64) (result, string) {
	now := time.Unix(1_700_000_000, 0)
	rule := simRule(mode, func() time.Time { return now })
	rng := rand.New(rand.NewPCG(1, 2))
	var events simHeap
	seq := 0
	push := func(at time.Time, kind int, r *simReq) {
		seq++
		heap.Push(&events, simEvent{at: at, seq: seq, kind: kind, req: r})
	}
	start := now
	measureFrom := start.Add(*warmup)
	end := measureFrom.Add(*duration)
	busy := 0
	var line []*simReq
	var res result
	finish := func(r *simReq, ok bool) {
		r.finished = true
		if !r.measured {
			return
		}
		res.offered++
		if r.critical {
			res.critOffered++
		}
		if ok {
			res.ok++
			res.lat = append(res.lat, now.Sub(r.arrived))
			if r.critical {
				res.critOK++
			}
		}
	}
	startWork := func(r *simReq) {
		r.started = true
		busy++
		f := math.Exp(rng.NormFloat64() * *jitter)
		push(now.Add(time.Duration(float64(*service)*f)), 1, r)
	}
	admitted := func(r *simReq) {
		if busy < *capacity {
			startWork(r)
		} else {
			line = append(line, r)
			push(now.Add(*timeout), 2, r)
		}
	}
	push(start, 0, nil)
	for events.Len() > 0 {
		e := heap.Pop(&events).(simEvent)
		now = e.at
		switch e.kind {
		case 0: // an arrival, which schedules the next
			if next := now.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second))); next.Before(end) {
				push(next, 0, nil)
			}
			r := &simReq{arrived: now, critical: rng.Float64() < *critical, measured: !now.Before(measureFrom)}
			if rule == nil {
				admitted(r)
				continue
			}
			prio := protect.Normal
			if r.critical {
				prio = protect.Critical
			}
			tk, cancel, err := rule.Enqueue(prio, func(tk protect.Ticket, err error) {
				seq++
				heap.Push(&events, simEvent{at: now, seq: seq, kind: 3, req: r, tk: tk, err: err})
			})
			switch {
			case cancel != nil:
				r.cancel = cancel
				push(now.Add(*maxWait), 4, r)
			case err != nil:
				finish(r, false)
			default:
				r.tk = tk
				admitted(r)
			}
		case 1: // a worker done
			r := e.req
			busy--
			r.tk.Done(false)
			finish(r, now.Sub(r.arrived) <= *timeout)
			for busy < *capacity && len(line) > 0 {
				next := line[0]
				line = line[1:]
				if !next.finished {
					startWork(next)
				}
			}
		case 2: // a client gives up while in line
			r := e.req
			if r.started || r.finished {
				continue
			}
			r.tk.Done(true) // the handler's 504
			finish(r, false)
		case 3: // a waiting critical request got a slot
			if e.err != nil {
				finish(e.req, false)
				continue
			}
			e.req.tk = e.tk
			admitted(e.req)
		case 4: // a critical request waited max_wait
			if e.req.cancel() {
				finish(e.req, false)
			}
		}
	}
	if rule == nil {
		return res, "–"
	}
	return res, fmt.Sprint(rule.Stats().Limit)
}
