package protect

import (
	"math"
	"runtime"
	"time"
)

// cpuGate is the MaxCPU check; its owner's mutex guards it. While the
// process's CPU use is above max, it limits requests in flight to the
// most completions per second seen over the last ten seconds times the
// least latency seen meanwhile: what the process has shown it can carry
// without queueing (Sentinel's system rule, after BBR's BDP).
type cpuGate struct {
	max     float64
	read    func() time.Duration
	lastAt  time.Time
	lastCPU time.Duration
	usage   float64
	slots   [10]cpuSlot
}

type cpuSlot struct {
	sec    int64
	done   int
	minRTT time.Duration
}

// cpuSampleEvery is how often the gate reads the process's CPU time.
const cpuSampleEvery = time.Second

// limit returns the in-flight limit the gate sets at now, 0 for none.
func (g *cpuGate) limit(now time.Time) int {
	if g.max == 0 || g.read == nil {
		return 0
	}
	if g.lastAt.IsZero() {
		g.lastAt, g.lastCPU = now, g.read()
	} else if d := now.Sub(g.lastAt); d >= cpuSampleEvery {
		cpu := g.read()
		g.usage = float64(cpu-g.lastCPU) / (float64(d) * float64(runtime.GOMAXPROCS(0)))
		g.lastAt, g.lastCPU = now, cpu
	}
	if g.usage <= g.max {
		return 0
	}
	sec := now.Unix()
	best, minRTT := 0, time.Duration(0)
	for _, s := range g.slots {
		if s.sec < sec-int64(len(g.slots)) || s.done == 0 {
			continue
		}
		// The current second is partly over: scale it to a whole one.
		if s.sec != sec {
			best = max(best, s.done)
		}
		if minRTT == 0 || s.minRTT < minRTT {
			minRTT = s.minRTT
		}
	}
	if best == 0 || minRTT == 0 {
		return 0 // nothing measured yet: no basis to shed on
	}
	return max(1, int(math.Ceil(float64(best)*minRTT.Seconds())))
}

// sample counts a completed call.
func (g *cpuGate) sample(now time.Time, rtt time.Duration) {
	if g.max == 0 {
		return
	}
	sec := now.Unix()
	s := &g.slots[uint64(sec)%uint64(len(g.slots))]
	if s.sec != sec {
		*s = cpuSlot{sec: sec}
	}
	s.done++
	if s.minRTT == 0 || rtt < s.minRTT {
		s.minRTT = max(rtt, time.Nanosecond)
	}
}
