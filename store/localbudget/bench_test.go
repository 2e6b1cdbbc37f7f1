package localbudget_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/localbudget"
	"github.com/weir-dev/weir/store/redisstore"
)

// benchEnv names the Redis address bench/budget/run.sh (make bench-budget)
// passes to TestHotKeyLoad; without it the test is skipped.
const benchEnv = "WEIR_BENCH_LEASE_ADDR"

// TestHotKeyLoad is make bench-budget's load, not a test: one hot key
// offered WEIR_BENCH_LEASE_RATE decisions/s (10,000) by 64 goroutines for
// WEIR_BENCH_LEASE_SECONDS (10) through redisstore, with a budget of
// WEIR_BENCH_LEASE_SIZE (100; 0 for none) under a fixed_window of
// WEIR_BENCH_LEASE_LIMIT per second (12,000). It prints one line that
// run.sh reads; run.sh measures Redis's time around it.
func TestHotKeyLoad(t *testing.T) {
	addr := os.Getenv(benchEnv)
	if addr == "" {
		t.Skip("run by make bench-lease")
	}
	env := func(name string, def int64) int64 {
		if v, err := strconv.ParseInt(os.Getenv(name), 10, 64); err == nil {
			return v
		}
		return def
	}
	rate, size := env("WEIR_BENCH_LEASE_RATE", 10000), env("WEIR_BENCH_LEASE_SIZE", 100)
	limit, secs := env("WEIR_BENCH_LEASE_LIMIT", 12000), env("WEIR_BENCH_LEASE_SECONDS", 10)
	ctx := context.Background()
	st, err := redisstore.New(ctx, redisstore.Config{Addrs: []string{addr}, Prefix: os.Getenv("WEIR_BENCH_LEASE_PREFIX"), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: limit, Period: time.Second}
	tb := localbudget.New(localbudget.Config{})

	// Pacing: every millisecond, the tokens due since the start; tokens
	// the workers cannot take at once are dropped (and show as a lower
	// decisions/s).
	tokens := make(chan struct{}, rate)
	stop := make(chan struct{})
	start := time.Now()
	go func() {
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		var sent int64
		for {
			select {
			case <-stop:
				close(tokens)
				return
			case now := <-tk.C:
				for due := int64(now.Sub(start).Seconds() * float64(rate)); sent < due; sent++ {
					select {
					case tokens <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	var decisions, admitted, errs atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range tokens {
				var r weir.Result
				var err error
				if size > 0 {
					r, err = tb.Take(ctx, st, "hot", l, 1, size)
				} else {
					r, err = st.Take(ctx, "hot", l, 1)
				}
				decisions.Add(1)
				if err != nil {
					errs.Add(1)
				} else if r.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	time.Sleep(time.Duration(secs) * time.Second)
	close(stop)
	wg.Wait()
	el := time.Since(start).Seconds()
	s := tb.Stats()
	fmt.Printf("hot-key decisions %d admitted %d errors %d per_s %.0f lease_calls %d lease_taken %d lease_lapsed %d\n",
		decisions.Load(), admitted.Load(), errs.Load(), float64(decisions.Load())/el, s.Calls, s.Taken, s.Lapsed)
}
