// Command flood measures weir's Redis store under a flood: many goroutines
// deciding through redisstore, most decisions from a few abusive keys far
// over their limit, the rest spread over many keys. It reports decisions/s
// and Redis's time per decision (the usec of the store's scripts in INFO
// commandstats over the decisions made), with or without the deny cache.
// bench/flood/run.sh runs it on a private redis-server; see
// docs/benchmarks.md.
//
//	go run ./flood -addr 127.0.0.1:6400 -cache=true
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/denycache"
	"github.com/weir-dev/weir/store/redisstore"
)

type config struct {
	addr        string
	cache       bool
	goroutines  int
	abusive     float64
	abusiveKeys int
	keys        int
	rate        int64
	algorithm   string
	duration    time.Duration
	jsonOut     bool
}

// result is one run's figures.
type result struct {
	Cache        bool    `json:"cache"`
	Decisions    int64   `json:"decisions"`
	PerSecond    float64 `json:"decisions_per_second"`
	Admitted     int64   `json:"admitted"`
	ScriptCalls  int64   `json:"script_calls"`
	ScriptUsec   int64   `json:"script_usec"`
	UsecPerDec   float64 `json:"redis_usec_per_decision"`
	CacheHits    int64   `json:"cache_hits"`
	HerdAnswers  int64   `json:"herd_answers"` // of the hits, those that waited for a lapsed denial's leader
	Errors       int64   `json:"errors"`
	Goroutines   int     `json:"goroutines"`
	AbusiveShare float64 `json:"abusive_share"`
}

func main() {
	var c config
	flag.StringVar(&c.addr, "addr", "127.0.0.1:6379", "the Redis to flood (use a private one)")
	flag.BoolVar(&c.cache, "cache", true, "put the deny cache in front of the store")
	flag.IntVar(&c.goroutines, "goroutines", 256, "concurrent deciders")
	flag.Float64Var(&c.abusive, "abusive", 0.9, "share of decisions from the abusive keys")
	flag.IntVar(&c.abusiveKeys, "abusive-keys", 10, "how many abusive keys")
	flag.IntVar(&c.keys, "keys", 100_000, "the other keys")
	flag.Int64Var(&c.rate, "rate", 100, "the limit per second of every key")
	flag.StringVar(&c.algorithm, "algorithm", string(weir.FixedWindow), "the limit's algorithm")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "how long to run")
	flag.BoolVar(&c.jsonOut, "json", false, "print JSON instead of a line")
	flag.Parse()
	r, err := run(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(1)
	}
	if c.jsonOut {
		_ = json.NewEncoder(os.Stdout).Encode(r)
		return
	}
	fmt.Printf("cache=%v decisions/s=%.0f redis_usec/decision=%.3f admitted=%d hits=%d errors=%d\n",
		r.Cache, r.PerSecond, r.UsecPerDec, r.Admitted, r.CacheHits, r.Errors)
}

func run(c config) (result, error) {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	rs, err := redisstore.New(ctx, redisstore.Config{Addrs: []string{c.addr}, Prefix: "flood" + strconv.FormatInt(time.Now().UnixNano(), 36)})
	if err != nil {
		return result{}, err
	}
	defer rs.Close()
	var store weir.Store = rs
	var dc *denycache.Store
	if c.cache {
		dc, err = denycache.New(rs, denycache.Config{Logger: quiet, Bus: denycache.NewRedisBus(rs.Client(), denycache.RedisBusConfig{Channel: "flood:denycache", Logger: quiet})})
		if err != nil {
			return result{}, err
		}
		defer dc.Close()
		deadline := time.Now().Add(10 * time.Second)
		for !dc.Live() {
			if time.Now().After(deadline) {
				return result{}, fmt.Errorf("the deny cache never subscribed")
			}
			time.Sleep(10 * time.Millisecond)
		}
		store = dc
	}
	lim := weir.Limit{Algorithm: weir.Algorithm(c.algorithm), Rate: c.rate, Period: time.Second}
	if err := lim.Validate(); err != nil {
		return result{}, err
	}
	abusive := make([]string, c.abusiveKeys)
	for i := range abusive {
		abusive[i] = fmt.Sprintf("abusive-%d", i)
	}
	keys := make([]string, c.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
	}
	u0, n0, err := scriptStats(ctx, rs.Client())
	if err != nil {
		return result{}, err
	}
	var decisions, admitted, errs atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for g := range c.goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 14))
			var d, a, e int64
			for !stop.Load() {
				var k string
				if len(abusive) > 0 && rng.Float64() < c.abusive {
					k = abusive[rng.IntN(len(abusive))]
				} else {
					k = keys[rng.IntN(len(keys))]
				}
				r, err := store.Take(ctx, k, lim, 1)
				d++
				if err != nil {
					e++
				} else if r.Allowed {
					a++
				}
			}
			decisions.Add(d)
			admitted.Add(a)
			errs.Add(e)
		}()
	}
	time.Sleep(c.duration)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start)
	u1, n1, err := scriptStats(ctx, rs.Client())
	if err != nil {
		return result{}, err
	}
	r := result{
		Cache: c.cache, Decisions: decisions.Load(), Admitted: admitted.Load(), Errors: errs.Load(),
		ScriptCalls: n1 - n0, ScriptUsec: u1 - u0, Goroutines: c.goroutines, AbusiveShare: c.abusive,
	}
	r.PerSecond = float64(r.Decisions) / el.Seconds()
	if r.Decisions > 0 {
		r.UsecPerDec = float64(r.ScriptUsec) / float64(r.Decisions)
	}
	if dc != nil {
		st := dc.Stats()
		r.CacheHits, r.HerdAnswers = st.Hits, st.Herd
	}
	return r, nil
}

// scriptStats sums the calls and usec of the commands that run the store's
// scripts (FCALL, EVALSHA, EVAL) in INFO commandstats.
func scriptStats(ctx context.Context, c rueidis.Client) (usec, calls int64, err error) {
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch name {
		case "cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha", "cmdstat_eval":
		default:
			continue
		}
		if !ok {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
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
