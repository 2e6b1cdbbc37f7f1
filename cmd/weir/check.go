package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/yamlnode"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/store/redisstore"
)

func init() {
	register("check", "run requests against a limit and print each decision", runCheck)
}

// checkLine is one decision as --json prints it.
type checkLine struct {
	Hit          int   `json:"hit"`
	Allowed      bool  `json:"allowed"`
	Limit        int64 `json:"limit"`
	Remaining    int64 `json:"remaining"`
	RetryAfterMS int64 `json:"retry_after_ms"`
	ResetAfterMS int64 `json:"reset_after_ms"`
	BlockedUntil int64 `json:"blocked_until"`
	DelayMS      int64 `json:"delay_ms,omitempty"`
}

func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("weir check", "Usage: weir check --limit 5/m [--algorithm gcra] [--key alice] [--hits 7] [flags]\n\nRuns requests against a limit and prints one line per decision. Exits 0\nwhether requests were admitted or not; 1 when the store fails (Redis\ncannot be reached); 2 on a usage error.\n\nFlags:", stderr)
	limitStr := fs.String("limit", "", `the limit, e.g. "5/m", "100/s burst 20" (required)`)
	algo := fs.String("algorithm", string(weir.GCRA), algorithm.JoinNames(algorithm.Names(), "or"))
	key := fs.String("key", "cli", "the key to limit")
	hits := fs.Int("hits", 1, "how many requests to make")
	cost := fs.Int64("cost", 1, "the cost of each request")
	parallel := fs.Int("parallel", 1, "spread the requests over this many goroutines")
	block := fs.Duration("block", 0, "penalty box after a rejection, e.g. 15m")
	maxDelay := fs.Duration("max-delay", 0, "leaky_bucket shaping: the longest delay allowed (0 = policing)")
	asJSON := fs.Bool("json", false, "print one JSON object per decision")
	timeout := fs.Duration("timeout", redisstore.DefaultTimeout, "with --redis: the deadline of each store call")
	redisURL := fs.String("redis", "", "use Redis at this URL instead of memory: redis://host:port/db, redis+sentinel://host:port,host:port/master, or host:port,host:port,... for a cluster")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "weir check: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *limitStr == "" {
		fmt.Fprintln(stderr, "weir check: --limit is required, e.g. --limit 5/m")
		return 2
	}
	l, err := weir.ParseLimit(*limitStr)
	if err != nil {
		fmt.Fprintln(stderr, "weir check:", errText(err))
		return 2
	}
	if _, known := weir.Algorithm(*algo).Kind(); !known {
		fmt.Fprintf(stderr, "weir check: --algorithm: %s\n", unknownAlgorithm(*algo))
		return 2
	}
	l.Algorithm, l.Block, l.MaxDelay = weir.Algorithm(*algo), *block, *maxDelay
	if err := l.Validate(); err != nil {
		fmt.Fprintln(stderr, "weir check:", errText(err))
		return 2
	}
	if *hits < 0 || *parallel < 1 || *cost < 0 {
		fmt.Fprintf(stderr, "weir check: --hits must be ≥ 0, --parallel ≥ 1 and --cost ≥ 0 (got %d, %d, %d)\n", *hits, *parallel, *cost)
		return 2
	}
	store, closeStore, code, err := openStore(*redisURL, *timeout)
	if err != nil {
		fmt.Fprintln(stderr, "weir check:", errText(err))
		return code
	}
	defer closeStore()
	lim := weir.NewLimiter(store)
	ctx := context.Background()

	var mu sync.Mutex // serializes output lines
	next := 0
	failed := false
	var wg sync.WaitGroup
	for g := 0; g < *parallel; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= *hits || failed {
					mu.Unlock()
					return
				}
				next++
				hit := next
				mu.Unlock()
				var res weir.Result
				var err error
				if l.Algorithm == weir.Concurrency && *cost > 0 {
					// Each hit acquires a lease and holds it.
					_, res, err = lim.AcquireN(ctx, *key, l, *cost)
				} else {
					res, err = lim.AllowN(ctx, *key, l, *cost)
				}
				mu.Lock()
				if err != nil {
					fmt.Fprintf(stderr, "weir check: hit %d: %s\n", hit, errText(err))
					failed = true
				} else {
					printDecision(stdout, hit, res, *asJSON)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failed {
		return 1
	}
	return 0
}

func printDecision(w io.Writer, hit int, r weir.Result, asJSON bool) {
	line := checkLine{
		Hit: hit, Allowed: r.Allowed, Limit: r.Limit, Remaining: r.Remaining,
		RetryAfterMS: ceilMS(r.RetryAfter), ResetAfterMS: ceilMS(r.ResetAfter), DelayMS: ceilMS(r.Delay),
	}
	if !r.BlockedUntil.IsZero() {
		line.BlockedUntil = r.BlockedUntil.UnixMilli()
	}
	if asJSON {
		b, _ := json.Marshal(line)
		fmt.Fprintf(w, "%s\n", b)
		return
	}
	verdict := "allowed "
	if !r.Allowed {
		verdict = "rejected"
	}
	fmt.Fprintf(w, "#%-3d %s remaining=%d/%d", hit, verdict, r.Remaining, r.Limit)
	if !r.Allowed {
		fmt.Fprintf(w, " retry_after=%v", r.RetryAfter.Round(time.Millisecond))
	}
	if r.Delay > 0 {
		fmt.Fprintf(w, " delay=%v", r.Delay.Round(time.Millisecond))
	}
	fmt.Fprintf(w, " reset_after=%v", r.ResetAfter.Round(time.Millisecond))
	if !r.BlockedUntil.IsZero() {
		fmt.Fprintf(w, " blocked_until=%s", r.BlockedUntil.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(w)
}

// ceilMS rounds a duration up to whole milliseconds, so that a client that
// waits that long is never early.
func ceilMS(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// openStore returns the store the command line asked for: memory, or the
// Redis that redisURL names (see redisstore.ParseURL), and a function that
// closes it. On failure code is the exit status: 2 for a bad flag, 1 when
// Redis cannot be reached.
func openStore(redisURL string, timeout time.Duration) (_ weir.Store, closeStore func(), code int, _ error) {
	if redisURL == "" {
		return memstore.New(), func() {}, 0, nil
	}
	cfg, err := redisstore.ParseURL(redisURL)
	if err != nil {
		return nil, nil, 2, fmt.Errorf("--redis: %w", err)
	}
	if timeout <= 0 {
		return nil, nil, 2, fmt.Errorf("--timeout %v: want a positive duration", timeout)
	}
	cfg.Timeout = timeout
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := redisstore.New(ctx, cfg)
	if err != nil {
		return nil, nil, 1, fmt.Errorf("--redis: %w", err) // names the addresses, never the password
	}
	return s, func() { s.Close() }, 0, nil
}

// unknownAlgorithm words the problem of an algorithm name that is none of
// weir's: with the closest name when there is one, else with them all.
func unknownAlgorithm(name string) string {
	if best := yamlnode.Suggest(name, algorithm.Names()); best != "" {
		return fmt.Sprintf("unknown algorithm %q (did you mean %q?)", name, best)
	}
	return fmt.Sprintf("unknown algorithm %q (want %s)", name, algorithm.JoinNames(algorithm.Names(), "or"))
}
