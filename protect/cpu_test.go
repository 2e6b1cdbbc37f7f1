package protect

import (
	"runtime"
	"testing"
	"time"
)

// TestCPUGate: under max_cpu nothing is shed; above it, requests are
// admitted only while in flight stays under the best completions per
// second times the least latency measured (here 100/s × 50 ms = 5).
func TestCPUGate(t *testing.T) {
	c := newClock()
	var cpu time.Duration
	procs := time.Duration(runtime.GOMAXPROCS(0))
	r := mustRule(t, Config{Name: "system", Concurrency: 1000, MaxCPU: 0.85, Now: c.Now, CPU: func() time.Duration { return cpu }})
	// Two seconds of 100 calls a second, 50 ms each, at 50% CPU.
	for range 2 {
		for range 100 {
			tk, err := r.Acquire(Normal)
			if err != nil {
				t.Fatalf("under max_cpu: %v", err)
			}
			c.Advance(50 * time.Millisecond)
			tk.Done(false)
			c.Advance(-40 * time.Millisecond) // overlapping calls: 10 ms apart
		}
		cpu += procs * time.Second / 2
	}
	// A call at the end of those two seconds samples 50% CPU: no gate.
	if tk, err := r.Acquire(Normal); err != nil {
		t.Fatalf("at 50%% CPU: %v", err)
	} else {
		tk.Cancel()
	}
	// The next second runs at 95% CPU.
	c.Advance(time.Second)
	cpu += procs * time.Second * 95 / 100
	var held []Ticket
	for {
		tk, err := r.Acquire(Normal)
		if err != nil {
			break
		}
		held = append(held, tk)
		if len(held) > 1000 {
			t.Fatal("no limit above max_cpu")
		}
	}
	if len(held) != 5 {
		t.Fatalf("admitted %d above max_cpu, want 5 (100/s × 50 ms)", len(held))
	}
	// CPU back under max_cpu: the gate lifts at the next sample.
	c.Advance(time.Second)
	cpu += procs * time.Second / 10
	if _, err := r.Acquire(Normal); err != nil {
		t.Fatalf("after CPU fell: %v", err)
	}
}
