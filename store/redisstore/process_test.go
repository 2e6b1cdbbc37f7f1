package redisstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
)

// childEnv carries a hammerJob to a re-executed test binary.
const childEnv = "WEIR_REDISSTORE_HAMMER_CHILD"

const (
	hammerProcs      = 4
	hammerGoroutines = 64
	hammerRounds     = 6 // takes per goroutine per algorithm: 4×64×6 = 1536 tries for 1000
	hammerLimit      = 1000
)

// hammerJob tells a child process what to hammer and when to start.
type hammerJob struct {
	Addr   string
	Prefix string
	Start  time.Time
}

// hammerLimitFor is 1000 per minute for the window algorithms and
// concurrency. The bucket algorithms refill continuously (1000/minute is one
// event back every 60ms), so a hammer lasting a second would legitimately
// admit a few more than 1000; they get 1000 per day, whose first refill
// comes 86s after the start, long after the hammer is over.
func hammerLimitFor(a weir.Algorithm) weir.Limit {
	l := weir.Limit{Algorithm: a, Rate: hammerLimit, Period: time.Minute}
	switch a {
	case weir.TokenBucket, weir.LeakyBucket, weir.GCRA:
		l.Period = 24 * time.Hour
	}
	return l
}

// TestExactAcrossProcesses runs 4 OS processes × 64 goroutines, each
// process with its own Store and connections, against one key per
// algorithm, deciding by Redis TIME (no test clock). Every algorithm must
// admit exactly 1000 in total: the scripts are atomic, so no interleaving
// of processes can overshoot or undershoot. The start is placed at least 8s
// before a minute boundary so that fixed_window and sliding_window run
// inside one window (their windows are aligned to the epoch).
func TestExactAcrossProcesses(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("running as a hammer child")
	}
	srv := redistest.Standalone(t)
	start := time.Now().Add(1500 * time.Millisecond)
	if start.Second() >= 52 {
		start = start.Truncate(time.Minute).Add(time.Minute + 500*time.Millisecond)
	}
	job, _ := json.Marshal(hammerJob{Addr: srv.Addr, Prefix: fmt.Sprintf("hammer%d", time.Now().UnixNano()), Start: start})
	var wg sync.WaitGroup
	outs := make([]bytes.Buffer, hammerProcs)
	errs := make([]error, hammerProcs)
	for p := range hammerProcs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHammerChild$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), childEnv+"="+string(job))
		cmd.Stdout = &outs[p]
		cmd.Stderr = &outs[p]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[p] = cmd.Wait()
		}()
	}
	wg.Wait()
	total := map[string]int64{}
	for p := range hammerProcs {
		if errs[p] != nil {
			t.Fatalf("child %d: %v\n%s", p, errs[p], outs[p].String())
		}
		sc := bufio.NewScanner(&outs[p])
		seen := 0
		for sc.Scan() {
			var algo string
			var n, nerr int64
			if _, err := fmt.Sscanf(sc.Text(), "hammer-child %s admitted %d errors %d", &algo, &n, &nerr); err != nil {
				continue
			}
			if nerr != 0 {
				t.Errorf("child %d, %s: %d store errors", p, algo, nerr)
			}
			total[algo] += n
			seen++
		}
		if seen != len(weir.Algorithms()) {
			t.Fatalf("child %d reported %d algorithms:\n%s", p, seen, outs[p].String())
		}
	}
	if time.Now().Truncate(time.Minute) != start.Truncate(time.Minute) {
		t.Logf("warning: the hammer crossed a minute boundary (started %v)", start)
	}
	var j hammerJob
	_ = json.Unmarshal(job, &j)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: j.Prefix})
	for _, a := range weir.Algorithms() {
		t.Logf("%-14s %d admitted by %d processes × %d goroutines", a, total[string(a)], hammerProcs, hammerGoroutines)
		if total[string(a)] != hammerLimit {
			t.Errorf("%s: %d admitted in total, want exactly %d", a, total[string(a)], hammerLimit)
		}
		if r, err := s.Take(context.Background(), "k", hammerLimitFor(a), 0); err != nil || r.Remaining != 0 {
			t.Errorf("%s: after the hammer: %+v %v, want 0 remaining", a, r, err)
		}
	}
}

// TestHammerChild is one process of TestExactAcrossProcesses; it does
// nothing unless started by it.
func TestHammerChild(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		t.Skip("runs only as a child of TestExactAcrossProcesses")
	}
	var job hammerJob
	if err := json.Unmarshal([]byte(raw), &job); err != nil {
		t.Fatal(err)
	}
	s := newTestStore(t, Config{Addrs: []string{job.Addr}, Prefix: job.Prefix, Timeout: 10 * time.Second})
	algos := weir.Algorithms()
	admitted := make([]atomic.Int64, len(algos))
	failed := make([]atomic.Int64, len(algos))
	var firstErr atomic.Value
	time.Sleep(time.Until(job.Start))
	var wg sync.WaitGroup
	for range hammerGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range hammerRounds {
				for i, a := range algos {
					r, err := s.Take(context.Background(), "k", hammerLimitFor(a), 1)
					if err != nil {
						failed[i].Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
						continue
					}
					admitted[i].Add(r.Granted)
				}
			}
		}()
	}
	wg.Wait()
	var b strings.Builder
	for i, a := range algos {
		fmt.Fprintf(&b, "hammer-child %s admitted %d errors %d\n", a, admitted[i].Load(), failed[i].Load())
	}
	if e := firstErr.Load(); e != nil {
		fmt.Fprintf(&b, "first error: %v\n", e)
	}
	fmt.Print(b.String())
}
