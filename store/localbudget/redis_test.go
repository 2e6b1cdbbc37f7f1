package localbudget_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/localbudget"
	"github.com/weir-dev/weir/store/redisstore"
)

// childEnv carries a hammerJob to a re-executed test binary.
const childEnv = "WEIR_LEASE_HAMMER_CHILD"

const (
	hammerProcs      = 4
	hammerGoroutines = 64
	hammerLimit      = 1000
	hammerLease      = 100
)

// hammerLimits are the budgeted limits the hammer runs, one key each (k0,
// k1, k2: both sliding windows would otherwise share one Redis key).
// Their windows are a day long, and runs keep clear of a day's end
// (awayFromDayEnd): deciding by Redis TIME, no run may cross a window,
// however slow the machine.
var hammerLimits = []weir.Limit{
	{Algorithm: weir.FixedWindow, Rate: hammerLimit, Period: 24 * time.Hour},
	{Algorithm: weir.SlidingWindow, Rate: hammerLimit, Period: 24 * time.Hour},
	{Algorithm: weir.SlidingWindow, Rate: hammerLimit, Period: 24 * time.Hour, Buckets: 4},
	{Algorithm: weir.FixedWindow, Rate: hammerLimit, Period: 24 * time.Hour}, // quiet: see quietLimit
}

// awayFromDayEnd returns at once unless the clock is within two minutes
// of the end of a UTC day, where the day-long windows of these tests turn
// over; then it waits for the new day, so that no run crosses a window.
func awayFromDayEnd(t *testing.T) {
	now := time.Now()
	end := now.Truncate(24 * time.Hour).Add(24 * time.Hour)
	if end.Sub(now) < 2*time.Minute {
		t.Logf("waiting %v for the next UTC day: the test's windows are a day long", end.Sub(now).Round(time.Second))
		time.Sleep(time.Until(end) + 500*time.Millisecond)
	}
}

// quietLimit is the index of the limit on which processes 2 and 3 ask
// once and fall silent, holding the rest of their budget: the others are
// then refused while units sit unspent, the under-admission the bound
// covers, measured.
const quietLimit = 3

type hammerJob struct {
	Index  int
	Addr   string
	Prefix string
	Start  time.Time
}

// hammer runs goroutines that each ask for key under l until refused,
// through one Table, and returns the units admitted.
func hammer(t testing.TB, tb *localbudget.Table, st weir.Store, key string, l weir.Limit, goroutines int) (admitted, errs int64) {
	var a, e atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				r, err := tb.Take(context.Background(), st, key, l, 1, hammerLease)
				if err != nil {
					e.Add(1)
					return
				}
				if !r.Allowed {
					return
				}
				a.Add(r.Granted)
			}
		}()
	}
	wg.Wait()
	return a.Load(), e.Load()
}

// TestLeaseAcrossProcesses: 4 OS processes × 64 goroutines, each process
// with its own Store and Table, on one key per budgeted limit of 1000 per
// day with budget 100, deciding by Redis TIME. Every goroutine asks
// until it is refused (but on the quiet limit two processes ask once and
// stop). The fleet must admit at most 1000, and at least 1000 − 4 × 100
// (the stated bound: instances × budget); the units debited in Redis are
// exactly those admitted plus those the processes still hold.
// The run keeps two minutes clear of a day's end, so that it falls in one
// window.
func TestLeaseAcrossProcesses(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("running as a hammer child")
	}
	srv := redistest.Standalone(t)
	awayFromDayEnd(t)
	start := time.Now().Add(1500 * time.Millisecond)
	prefix := fmt.Sprintf("lease%d", time.Now().UnixNano())
	var wg sync.WaitGroup
	outs := make([]bytes.Buffer, hammerProcs)
	errs := make([]error, hammerProcs)
	for p := range hammerProcs {
		job, _ := json.Marshal(hammerJob{Index: p, Addr: srv.Addr, Prefix: prefix, Start: start})
		cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseHammerChild$", "-test.count=1", "-test.v")
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
	admitted := make([]int64, len(hammerLimits))
	held := make([]int64, len(hammerLimits))
	for p := range hammerProcs {
		if errs[p] != nil {
			t.Fatalf("child %d: %v\n%s", p, errs[p], outs[p].String())
		}
		sc := bufio.NewScanner(&outs[p])
		seen := 0
		for sc.Scan() {
			var i int
			var a, h, nerr int64
			if _, err := fmt.Sscanf(sc.Text(), "lease-child %d admitted %d held %d errors %d", &i, &a, &h, &nerr); err != nil {
				continue
			}
			if nerr != 0 {
				t.Errorf("child %d, limit %d: %d store errors", p, i, nerr)
			}
			admitted[i] += a
			held[i] += h
			seen++
		}
		if seen != len(hammerLimits) {
			t.Fatalf("child %d reported %d limits:\n%s", p, seen, outs[p].String())
		}
	}
	if time.Now().Truncate(24*time.Hour) != start.Truncate(24*time.Hour) {
		t.Logf("warning: the hammer crossed a day's end (started %v)", start)
	}
	s, err := redisstore.New(context.Background(), redisstore.Config{Addrs: []string{srv.Addr}, Prefix: prefix, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, l := range hammerLimits {
		t.Logf("%v buckets %d: %d admitted, %d held back unspent, by %d processes × %d goroutines (bound: %d held)",
			l.Algorithm, l.Buckets, admitted[i], held[i], hammerProcs, hammerGoroutines, hammerProcs*hammerLease)
		if admitted[i] > hammerLimit {
			t.Errorf("%v: %d admitted, over the limit %d", l, admitted[i], hammerLimit)
		}
		if admitted[i] < hammerLimit-hammerProcs*hammerLease {
			t.Errorf("%v: %d admitted, under-admission beyond the bound %d", l, admitted[i], hammerProcs*hammerLease)
		}
		if i == quietLimit && held[i] == 0 {
			t.Errorf("quiet limit: nothing held back; the silent processes should hold their leases")
		}
		if admitted[i]+held[i] != hammerLimit {
			t.Errorf("%v: %d admitted + %d held != %d debited", l, admitted[i], held[i], hammerLimit)
		}
		if r, err := s.Take(context.Background(), fmt.Sprint("k", i), l, 0); err != nil || r.Remaining != 0 {
			t.Errorf("%v: after the hammer: %+v %v, want 0 remaining in Redis", l, r, err)
		}
	}
}

// TestLeaseHammerChild is one process of TestLeaseAcrossProcesses; it does
// nothing unless started by it.
func TestLeaseHammerChild(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		t.Skip("runs only as a child of TestLeaseAcrossProcesses")
	}
	var job hammerJob
	if err := json.Unmarshal([]byte(raw), &job); err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.New(context.Background(), redisstore.Config{Addrs: []string{job.Addr}, Prefix: job.Prefix, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tb := localbudget.New(localbudget.Config{})
	time.Sleep(time.Until(job.Start))
	var out bytes.Buffer
	for i, l := range hammerLimits {
		before := tb.Stats()
		var a, nerr int64
		if i == quietLimit && job.Index >= 2 {
			r, err := tb.Take(context.Background(), s, fmt.Sprint("k", i), l, 1, hammerLease)
			if err != nil {
				nerr++
			}
			a = r.Granted
		} else {
			a, nerr = hammer(t, tb, s, fmt.Sprint("k", i), l, hammerGoroutines)
		}
		after := tb.Stats()
		held := (after.Taken - before.Taken) - (after.Spent - before.Spent)
		fmt.Fprintf(&out, "lease-child %d admitted %d held %d errors %d\n", i, a, held, nerr)
	}
	fmt.Print(out.String())
}

// TestLeaseSentinelAndCluster: four tables (four instances) × 16
// goroutines on one budgeted key through a Sentinel-followed master and a
// Redis Cluster: at most the limit, at least the limit − 4 × budget.
func TestLeaseSentinelAndCluster(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("running as a hammer child")
	}
	deployments := []struct {
		name string
		cfg  func(t *testing.T) redisstore.Config
	}{
		{"sentinel", func(t *testing.T) redisstore.Config {
			g := redistest.Sentinel(t)
			return redisstore.Config{Addrs: g.SentinelAddrs, MasterName: g.MasterName}
		}},
		{"cluster", func(t *testing.T) redisstore.Config {
			c := redistest.Cluster(t)
			return redisstore.Config{Addrs: c.Addrs}
		}},
	}
	for _, d := range deployments {
		t.Run(d.name, func(t *testing.T) {
			cfg := d.cfg(t)
			cfg.Timeout = 5 * time.Second
			// A window of a day, kept clear of its end: the run never
			// crosses one.
			awayFromDayEnd(t)
			l := weir.Limit{Algorithm: weir.FixedWindow, Rate: hammerLimit, Period: 24 * time.Hour}
			var total, held int64
			var wg sync.WaitGroup
			var mu sync.Mutex
			for range 4 {
				s, err := redisstore.New(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				tb := localbudget.New(localbudget.Config{})
				wg.Add(1)
				go func() {
					defer wg.Done()
					a, nerr := hammer(t, tb, s, "hot", l, 16)
					if nerr != 0 {
						t.Errorf("%d store errors", nerr)
					}
					st := tb.Stats()
					mu.Lock()
					total += a
					held += st.Taken - st.Spent
					mu.Unlock()
				}()
			}
			wg.Wait()
			t.Logf("%s: %d admitted, %d held back", d.name, total, held)
			if total > hammerLimit || total < hammerLimit-4*hammerLease || total+held != hammerLimit {
				t.Errorf("%s: %d admitted + %d held; want at most %d, at least %d, and %d debited", d.name, total, held, hammerLimit, hammerLimit-4*hammerLease, hammerLimit)
			}
		})
	}
}

// TestLeaseClusterMigration: budgets on a hot key while its slot moves
// between Cluster nodes twice under load (MOVED, ASK, TRYAGAIN). Redis's
// count must cover every unit admitted (nothing spent undebited), and
// exceed it only by the units still held and what failed calls may have
// taken.
func TestLeaseClusterMigration(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("running as a hammer child")
	}
	c := redistest.Cluster(t)
	cfg := redisstore.Config{Addrs: c.Addrs, Timeout: 5 * time.Second, Prefix: "mig"}
	const size = 10
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1_000_000, Period: 24 * time.Hour}
	awayFromDayEnd(t) // Redis's count is read in the same window
	v, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", "hot")
	if err != nil {
		t.Fatal(err)
	}
	slot := int(v.(int64))
	stop := make(chan struct{})
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	tables := make([]*localbudget.Table, 4)
	for i := range tables {
		s, err := redisstore.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		tables[i] = localbudget.New(localbudget.Config{})
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					r, err := tables[i].Take(context.Background(), s, "hot", l, 1, size)
					if err != nil {
						failed.Add(1)
						continue
					}
					admitted.Add(r.Granted)
					time.Sleep(100 * time.Microsecond)
				}
			}()
		}
	}
	from := c.NodeForSlot(slot)
	to := c.Nodes[0]
	if to == from {
		to = c.Nodes[1]
	}
	time.Sleep(50 * time.Millisecond)
	for i := range 2 {
		if err := c.MigrateSlot(slot, from, to); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("migration %d: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond)
		from, to = to, from
	}
	close(stop)
	wg.Wait()
	var held, calls int64
	for _, tb := range tables {
		s := tb.Stats()
		held += s.Taken - s.Spent - s.Lapsed
		calls += s.Calls
	}
	s, err := redisstore.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.Take(context.Background(), "hot", l, 0)
	if err != nil {
		t.Fatal(err)
	}
	used := l.Rate - r.Remaining
	t.Logf("slot %d moved twice under load: %d admitted, %d held, %d debited in Redis, %d lease calls, %d failed", slot, admitted.Load(), held, used, calls, failed.Load())
	if admitted.Load() == 0 || calls < 10 {
		t.Fatalf("no load: %d admitted in %d calls", admitted.Load(), calls)
	}
	if used < admitted.Load()+held || used > admitted.Load()+held+failed.Load()*size {
		t.Errorf("Redis debited %d for %d admitted + %d held (%d failed calls of up to %d)", used, admitted.Load(), held, failed.Load(), size)
	}
}
