package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/redistest"
)

// benchEnv names a running Redis for the benchmarks (bench/redis/run.sh
// sets it so that the Go figures and redis-benchmark's ceiling come from
// the same server in the same run); without it a redistest server is
// started.
const benchEnv = "WEIR_BENCH_REDIS"

// benchKeys is the key space the benchmarks draw from, as run.sh's
// redis-benchmark does with -r.
const benchKeys = 100_000

// benchLimit is the limit every benchmark runs: high enough that most
// decisions admit, as in normal traffic.
func benchLimit(a weir.Algorithm) weir.Limit {
	return weir.Limit{Algorithm: a, Rate: 1000, Period: time.Second}
}

// BenchmarkTake measures decisions per second through the store, one
// Take per decision, from 1, 16, 64 and 256 goroutines sharing one Store
// (which coalesces their decisions into batches; decisions/call reports
// the mean batch), on keys drawn at random from 100k.
func BenchmarkTake(b *testing.B) {
	addr := os.Getenv(benchEnv)
	if addr == "" {
		addr = redistest.Standalone(b).Addr
	}
	s, err := New(context.Background(), Config{Addrs: []string{addr}, Prefix: "gobench", Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "b" + strconv.Itoa(i)
	}
	for _, a := range weir.Algorithms() {
		l := benchLimit(a)
		b.Run(string(a), func(b *testing.B) {
			for _, g := range []int{1, 16, 64, 256} {
				b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
					var next atomic.Int64
					var failed atomic.Value
					var wg sync.WaitGroup
					calls0, decisions0 := s.batchStats()
					b.ResetTimer()
					start := time.Now()
					for w := range g {
						wg.Add(1)
						go func() {
							defer wg.Done()
							rng := rand.New(rand.NewPCG(uint64(w), 1))
							for next.Add(1) <= int64(b.N) {
								if _, err := s.Take(context.Background(), keys[rng.IntN(len(keys))], l, 1); err != nil {
									failed.CompareAndSwap(nil, err)
									return
								}
							}
						}()
					}
					wg.Wait()
					elapsed := time.Since(start)
					b.StopTimer()
					if err := failed.Load(); err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
					if calls, decisions := s.batchStats(); calls > calls0 {
						b.ReportMetric(float64(decisions-decisions0)/float64(calls-calls0), "decisions/call")
					}
				})
			}
		})
	}
}

// TestDumpScripts writes what bench/redis/run.sh needs to call the scripts
// from redis-benchmark and redis-cli: the library and its take function's
// name; per algorithm, the assembled EVAL script, its SHA-1, and the ARGV
// tail (after now, n, mode, id) for the benchmark limit and for 100 per
// minute. It runs only when WEIR_BENCH_DUMP names a directory.
func TestDumpScripts(t *testing.T) {
	dir := os.Getenv("WEIR_BENCH_DUMP")
	if dir == "" {
		t.Skip("WEIR_BENCH_DUMP not set")
	}
	if err := os.WriteFile(filepath.Join(dir, "library.lua"), []byte(lib.src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "take.fn"), []byte(takeRoutines[algorithm.FixedWindow].fn+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, a := range weir.Algorithms() {
		kind, _ := a.Kind()
		sc := takeRoutines[kind].script
		write := func(name, content string) {
			if err := os.WriteFile(filepath.Join(dir, string(a)+"."+name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write("lua", sc.src)
		write("sha", sc.sha+"\n")
		for name, l := range map[string]weir.Limit{"args": benchLimit(a), "args100": {Algorithm: a, Rate: 100, Period: time.Minute}} {
			p, err := l.Compile()
			if err != nil {
				t.Fatal(err)
			}
			args := limitArgs(&p)
			write(name, strings.Join(args[:], " ")+"\n")
		}
	}
}
