// Command usec measures what Redis spends per decision of weir's Redis
// store on the uniform load: many goroutines deciding through redisstore
// (coalesced, as weir serve decides), one limit, keys drawn uniformly from
// a large key space, one descriptor per call. It resets INFO commandstats
// (CONFIG RESETSTAT) and reports the usec of the store's scripts (FCALL,
// EVALSHA, EVAL) over the decisions made, the decisions per script call,
// and redis-server's own CPU time per decision. bench/redis/ab.sh runs it
// against another commit's build, round by round; see docs/benchmarks.md.
//
//	go run ./redis/usec -addr 127.0.0.1:6400 -overrides
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/redisstore"
)

// result is one run's figures.
type result struct {
	Algorithm   string  `json:"algorithm"`
	Overrides   bool    `json:"overrides"`
	Decisions   int64   `json:"decisions"`
	PerSecond   float64 `json:"decisions_per_second"`
	ScriptCalls int64   `json:"script_calls"`
	UsecPerDec  float64 `json:"redis_usec_per_decision"`
	CPUPerDec   float64 `json:"redis_cpu_usec_per_decision"`
	PerCall     float64 `json:"decisions_per_call"`
	Errors      int64   `json:"errors"`
}

func main() {
	addr := flag.String("addr", "", "the Redis to use (a private one: its stats are reset)")
	algo := flag.String("algorithm", string(weir.FixedWindow), "the limit's algorithm")
	overrides := flag.Bool("overrides", true, "the store keeps overrides, as weir serve's does (no override is set)")
	goroutines := flag.Int("goroutines", 64, "concurrent deciders")
	keys := flag.Int("keys", 100_000, "the key space, drawn uniformly")
	rate := flag.Int64("rate", 100, "the limit per second of every key")
	duration := flag.Duration("duration", 5*time.Second, "how long to run")
	jsonOut := flag.Bool("json", false, "print JSON instead of a line")
	flag.Parse()
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "usec: -addr is required (a private Redis: its stats are reset)")
		os.Exit(2)
	}
	lim := weir.Limit{Algorithm: weir.Algorithm(*algo), Rate: *rate, Period: time.Second}
	r, err := run(*addr, lim, *overrides, *goroutines, *keys, *duration)
	if err != nil {
		fmt.Fprintln(os.Stderr, "usec:", err)
		os.Exit(1)
	}
	if *jsonOut {
		_ = json.NewEncoder(os.Stdout).Encode(r)
		return
	}
	fmt.Printf("%s overrides=%v decisions/s=%.0f redis_usec/decision=%.3f redis_cpu_usec/decision=%.3f decisions/call=%.1f errors=%d\n",
		r.Algorithm, r.Overrides, r.PerSecond, r.UsecPerDec, r.CPUPerDec, r.PerCall, r.Errors)
}

func run(addr string, lim weir.Limit, overrides bool, goroutines, nkeys int, duration time.Duration) (result, error) {
	ctx := context.Background()
	if err := lim.Validate(); err != nil {
		return result{}, err
	}
	rs, err := redisstore.New(ctx, redisstore.Config{Addrs: []string{addr}, Overrides: overrides, Timeout: 10 * time.Second,
		Prefix: "usec" + strconv.FormatInt(time.Now().UnixNano(), 36)})
	if err != nil {
		return result{}, err
	}
	defer rs.Close()
	c := rs.Client()
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "client_" + strconv.Itoa(i)
	}
	// Warm up: the library loaded, connections open.
	if _, err := rs.Take(ctx, keys[0], lim, 1); err != nil {
		return result{}, err
	}
	if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
		return result{}, err
	}
	cpu0, err := redisCPU(ctx, c)
	if err != nil {
		return result{}, err
	}
	var decisions, errs atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 33))
			var d, e int64
			for !stop.Load() {
				if _, err := rs.Take(ctx, keys[rng.IntN(len(keys))], lim, 1); err != nil {
					e++
				}
				d++
			}
			decisions.Add(d)
			errs.Add(e)
		}()
	}
	time.Sleep(duration)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start)
	usec, calls, err := scriptStats(ctx, c)
	if err != nil {
		return result{}, err
	}
	cpu1, err := redisCPU(ctx, c)
	if err != nil {
		return result{}, err
	}
	r := result{Algorithm: string(lim.Algorithm), Overrides: overrides, Decisions: decisions.Load(), Errors: errs.Load(), ScriptCalls: calls}
	r.PerSecond = float64(r.Decisions) / el.Seconds()
	if r.Decisions > 0 {
		r.UsecPerDec = float64(usec) / float64(r.Decisions)
		r.CPUPerDec = (cpu1 - cpu0) / float64(r.Decisions)
	}
	if calls > 0 {
		r.PerCall = float64(r.Decisions) / float64(calls)
	}
	return r, nil
}

// info returns the fields of an INFO section.
func info(ctx context.Context, c rueidis.Client, section string) (map[string]string, error) {
	s, err := c.Do(ctx, c.B().Info().Section(section).Build()).ToString()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// redisCPU returns redis-server's CPU time so far (user + system), in µs.
func redisCPU(ctx context.Context, c rueidis.Client) (float64, error) {
	m, err := info(ctx, c, "cpu")
	if err != nil {
		return 0, err
	}
	u, _ := strconv.ParseFloat(m["used_cpu_user"], 64)
	s, _ := strconv.ParseFloat(m["used_cpu_sys"], 64)
	return (u + s) * 1e6, nil
}

// scriptStats sums the usec and calls of the commands that run the store's
// scripts (FCALL, EVALSHA, EVAL) in INFO commandstats.
func scriptStats(ctx context.Context, c rueidis.Client) (usec, calls int64, err error) {
	m, err := info(ctx, c, "commandstats")
	if err != nil {
		return 0, 0, err
	}
	for _, name := range []string{"cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha", "cmdstat_eval"} {
		for _, f := range strings.Split(m[name], ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls += n
			case "usec":
				usec += n
			}
		}
	}
	return usec, calls, nil
}
