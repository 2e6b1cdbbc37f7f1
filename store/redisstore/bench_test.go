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
			// One ARGV value a line (the packed limit is one).
			write(name, limitArg(&p)+"\n")
		}
	}
}

// redisWork sums, over servers, the CPU time of the redis-server processes
// (INFO cpu: user and system) and the time spent in weir's scripts (INFO
// commandstats: FCALL, EVALSHA and EVAL), in µs.
func redisWork(b *testing.B, servers []*redistest.Server) (cpu, scripts float64) {
	b.Helper()
	for _, srv := range servers {
		for _, section := range []string{"cpu", "commandstats"} {
			v, err := srv.Do("INFO", section)
			if err != nil {
				b.Fatal(err)
			}
			text, _ := v.(string)
			for _, line := range strings.Split(text, "\n") {
				line = strings.TrimSpace(line)
				name, value, ok := strings.Cut(line, ":")
				if !ok {
					continue
				}
				switch name {
				case "used_cpu_user", "used_cpu_sys":
					f, _ := strconv.ParseFloat(value, 64)
					cpu += f * 1e6
				case "cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval":
					for _, kv := range strings.Split(value, ",") {
						if u, ok := strings.CutPrefix(kv, "usec="); ok {
							f, _ := strconv.ParseFloat(u, 64)
							scripts += f
						}
					}
				}
			}
		}
	}
	return cpu, scripts
}

// BenchmarkClusterNodes compares the work a Redis Cluster node does per
// decision with a standalone Redis's, at the same load per node (256
// goroutines and keys drawn from 100k per Redis): a standalone Redis (coalesced batches), a three-node Cluster with
// per-node batches, and the same Cluster with MaxBatch 1 (every decision a
// call of its own, as before per-node coalescing). It starts its own
// servers. Besides decisions/s (which on a small machine the client's
// CPU bounds) it reports what bounds a Redis: the CPU time of the
// redis-server processes per decision (cpu-µs/decision, summed over the
// nodes), its inverse node-decisions/s (what one fully busy Redis core
// would make), and the scripts' own time per decision (script-µs/decision,
// INFO commandstats). bench/redis/run.sh prints them as a table.
func BenchmarkClusterNodes(b *testing.B) {
	standalone := redistest.Standalone(b)
	cluster := redistest.Cluster(b)
	// The same load per busy Redis: 256 goroutines, keys drawn from 100k.
	// "one-node" runs draw only keys of the first node's slots (0-5460),
	// so that one redis-server works and the others idle; the standalone
	// runs draw the same keys. The three-node runs draw from keys of all
	// slots, 100k per node. (Equal key spaces matter: with a third of the
	// keys, a node finds three times as many keys alive, which costs a
	// sliding log more per decision.)
	var keys, node0Keys []string
	for i := 0; len(node0Keys) < benchKeys; i++ {
		k := "b" + strconv.Itoa(i)
		keys = append(keys, k)
		if slot(tagOf(k)) <= 5460 {
			node0Keys = append(node0Keys, k)
		}
	}
	deployments := []struct {
		name     string
		addrs    []string
		servers  []*redistest.Server // the busy ones
		keys     []string
		maxBatch int
	}{
		{"standalone", []string{standalone.Addr}, []*redistest.Server{standalone}, node0Keys, 0},
		{"standalone-unbatched", []string{standalone.Addr}, []*redistest.Server{standalone}, node0Keys, 1},
		{"cluster", cluster.Addrs, cluster.Nodes, keys, 0},
		{"cluster-unbatched", cluster.Addrs, cluster.Nodes, keys, 1},
		{"cluster-one-node", cluster.Addrs, cluster.Nodes[:1], node0Keys, 0},
		{"cluster-one-node-unbatched", cluster.Addrs, cluster.Nodes[:1], node0Keys, 1},
	}
	for _, a := range weir.Algorithms() {
		l := benchLimit(a)
		b.Run(string(a), func(b *testing.B) {
			for _, d := range deployments {
				b.Run(d.name, func(b *testing.B) {
					s, err := New(context.Background(), Config{Addrs: d.addrs, Prefix: "gobench", Timeout: 10 * time.Second, MaxBatch: d.maxBatch})
					if err != nil {
						b.Fatal(err)
					}
					defer s.Close()
					g := 256 * len(d.servers)
					var next atomic.Int64
					var failed atomic.Value
					var wg sync.WaitGroup
					calls0, decisions0 := s.batchStats()
					cpu0, scripts0 := redisWork(b, d.servers)
					b.ResetTimer()
					start := time.Now()
					for w := range g {
						wg.Add(1)
						go func() {
							defer wg.Done()
							rng := rand.New(rand.NewPCG(uint64(w), 2))
							for next.Add(1) <= int64(b.N) {
								if _, err := s.Take(context.Background(), d.keys[rng.IntN(len(d.keys))], l, 1); err != nil {
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
					cpu1, scripts1 := redisWork(b, d.servers)
					perDecision := (cpu1 - cpu0) / float64(b.N)
					b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
					b.ReportMetric(perDecision, "cpu-µs/decision")
					b.ReportMetric(1e6/perDecision, "node-decisions/s")
					b.ReportMetric((scripts1-scripts0)/float64(b.N), "script-µs/decision")
					if calls, decisions := s.batchStats(); calls > calls0 {
						b.ReportMetric(float64(decisions-decisions0)/float64(calls-calls0), "decisions/call")
					}
				})
			}
		})
	}
}

// BenchmarkTakeOverrides is BenchmarkTake's decision on a store without
// Config.Overrides ("off") and with it ("on": every decision reads its
// key's override key, none of which exists), side by side on one Redis.
func BenchmarkTakeOverrides(b *testing.B) {
	addr := os.Getenv(benchEnv)
	if addr == "" {
		addr = redistest.Standalone(b).Addr
	}
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "b" + strconv.Itoa(i)
	}
	for _, a := range []weir.Algorithm{weir.FixedWindow, weir.GCRA} {
		l := benchLimit(a)
		for _, on := range []bool{false, true} {
			s, err := New(context.Background(), Config{Addrs: []string{addr}, Prefix: "gobench", Timeout: 10 * time.Second, Overrides: on})
			if err != nil {
				b.Fatal(err)
			}
			name := "off"
			if on {
				name = "on"
			}
			for _, g := range []int{1, 64} {
				b.Run(fmt.Sprintf("%s/%s/g=%d", a, name, g), func(b *testing.B) {
					if err := s.client.Do(context.Background(), s.client.B().ConfigResetstat().Build()).Error(); err != nil {
						b.Fatal(err)
					}
					var next atomic.Int64
					var wg sync.WaitGroup
					b.ResetTimer()
					start := time.Now()
					for w := range g {
						wg.Add(1)
						go func() {
							defer wg.Done()
							rng := rand.New(rand.NewPCG(uint64(w), 1))
							for next.Add(1) <= int64(b.N) {
								if _, err := s.Take(context.Background(), keys[rng.IntN(len(keys))], l, 1); err != nil {
									b.Error(err)
									return
								}
							}
						}()
					}
					wg.Wait()
					b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
					b.ReportMetric(scriptMicros(b, s)/float64(b.N), "redis-µs/decision")
				})
			}
			s.Close()
		}
	}
}

// scriptMicros is the µs Redis spent in weir's scripts since the last
// CONFIG RESETSTAT (INFO commandstats: FCALL and EVALSHA), a figure the
// clients' scheduling does not touch.
func scriptMicros(b *testing.B, s *Store) float64 {
	info, err := s.client.Do(context.Background(), s.client.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_fcall:") && !strings.HasPrefix(line, "cmdstat_evalsha:") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseFloat(v, 64)
				total += n
			}
		}
	}
	return total
}
