package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func init() {
	register("bench", "drive load at a running weir and report throughput and latency", runBench)
}

// leanClient returns the callers of the lean gRPC client (--grpc-client
// lean), one per --connections, and the function that closes them. It is
// nil unless weir is built with the bench tag (bench_lean.go), so that
// the product binary carries no hand-written HTTP/2 client.
var leanClient func(benchConfig, bool) ([]caller, func())

// defaultGRPCClient is --grpc-client's default: lean where it is built in.
func defaultGRPCClient() string {
	if leanClient != nil {
		return "lean"
	}
	return "grpc-go"
}

type benchConfig struct {
	target      string // grpc | check | auth
	grpcClient  string // lean | grpc-go
	addr        string
	concurrency int
	conns       int
	duration    time.Duration
	requests    int64
	keys        int
	dist        string
	zipfS       float64
	abusive     float64
	abusiveKeys int
	domain      string
	descriptors int // grpc: descriptors per call
	rule        string
	path        string
	jsonOut     bool
	quiet       bool
	rate        float64
}

// benchSummary is the machine-readable result (--json).
type benchSummary struct {
	Target      string  `json:"target"`
	GRPCClient  string  `json:"grpc_client,omitempty"`
	Addr        string  `json:"addr"`
	Concurrency int     `json:"concurrency"`
	Connections int     `json:"connections"`
	Keys        int     `json:"keys"`
	Dist        string  `json:"distribution"`
	Abusive     float64 `json:"abusive_share"`
	Seconds     float64 `json:"seconds"`
	// Total counts calls: Decisions (Allowed + Limited) and Errors.
	Total     int64 `json:"total"`
	Decisions int64 `json:"decisions"`
	Allowed   int64 `json:"allowed"`
	Limited   int64 `json:"limited"`
	Errors    int64 `json:"errors"`
	// Ruled counts the decisions a rule made: a call that matches no
	// rule is allowed without deciding anything.
	Ruled      int64              `json:"ruled"`
	PerSecond  float64            `json:"decisions_per_second"`
	LatencyMS  map[string]float64 `json:"latency_ms"`
	FirstError string             `json:"first_error,omitempty"`
	// Failed is set when most calls failed: the run measured nothing and
	// weir bench exits 1.
	Failed   bool     `json:"failed"`
	Warnings []string `json:"warnings,omitempty"`

	histogram *histogram
}

func runBench(args []string, stdout, stderr io.Writer) int {
	c, code, ok := parseBenchArgs(args, stdout, stderr)
	if !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sum, err := bench(ctx, c, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "weir bench:", err)
		return 1
	}
	if c.jsonOut {
		b, _ := json.MarshalIndent(sum, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
		for _, w := range sum.Warnings {
			fmt.Fprintln(stderr, "weir bench: warning:", w)
		}
	} else {
		printSummary(stdout, sum)
	}
	if sum.Failed {
		fmt.Fprintf(stderr, "weir bench: %d of %s failed, first: %s\n", sum.Errors, count(sum.Total, "call", "calls"), sum.FirstError)
		return 1
	}
	return 0
}

// parseBenchArgs reads weir bench's flags. On bad usage (or -h) it writes
// why to stderr and returns ok false and the exit code.
func parseBenchArgs(args []string, stdout, stderr io.Writer) (c benchConfig, code int, ok bool) {
	fs := newFlagSet("weir bench", "Usage: weir bench [--target check|grpc|auth] [--addr ADDR] [flags]\n\nDrives load at a running weir (only addresses you own: loopback or your own\nhosts), shows a live progress line, then decisions/s, allowed/limited, errors\n(counted apart) and latency percentiles with a histogram. Warns when no rule\ndecided any call. Exits 1 when the first call fails (nothing is measured) or\nwhen most calls failed, 2 on a usage error.\n\nFlags:", stderr)
	fs.StringVar(&c.target, "target", "check", "what to call: check (POST /v1/check with --rule), grpc (Envoy ShouldRateLimit in --domain) or auth (GET /v1/auth)")
	fs.StringVar(&c.grpcClient, "grpc-client", defaultGRPCClient(), "grpc: the gRPC client, lean (a minimal HTTP/2 client, cheap enough not to starve a server on the same machine; only in a weir built with -tags bench) or grpc-go")
	fs.StringVar(&c.addr, "addr", "", "weir's address (default 127.0.0.1:8081 for grpc, http://127.0.0.1:8080 otherwise)")
	fs.IntVar(&c.concurrency, "concurrency", 64, "concurrent callers")
	fs.IntVar(&c.conns, "connections", 0, "gRPC connections shared by the callers (default: one per caller)")
	fs.DurationVar(&c.duration, "duration", 15*time.Second, "how long to run")
	fs.Int64Var(&c.requests, "requests", 0, "stop after this many requests instead (0 = run for --duration)")
	fs.IntVar(&c.keys, "keys", 100_000, "size of the key space")
	fs.StringVar(&c.dist, "dist", "uniform", "key distribution: uniform (every key in turn, each at the same even rate) or zipf (random, with hot keys as in real traffic)")
	fs.Float64Var(&c.zipfS, "zipf-s", 1.1, "zipf exponent (> 1; larger = hotter keys)")
	fs.Float64Var(&c.abusive, "abusive", 0, "share of requests (0..1) sent by a few abusive keys that exceed their limit")
	fs.IntVar(&c.abusiveKeys, "abusive-keys", 10, "how many abusive keys")
	fs.StringVar(&c.domain, "domain", "bench", "grpc: the rate-limit domain; descriptors are [{key: client, value: <key>}]")
	fs.IntVar(&c.descriptors, "descriptors", 1, "grpc: descriptors per call, [{client: <key>}], [{client2: <key>}], ... (1 to 64)")
	fs.StringVar(&c.rule, "rule", "demo-ip", "check: the rule name to check (demo-ip is one of weir serve's demo rules)")
	fs.StringVar(&c.path, "path", "/", "auth: the original URI sent in X-Original-URI")
	fs.Float64Var(&c.rate, "rate", 0, "pace the load to this many requests per second in total (0 = as fast as the callers can go)")
	fs.BoolVar(&c.jsonOut, "json", false, "print the summary as JSON")
	fs.BoolVar(&c.quiet, "quiet", false, "no live progress line")
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return c, code, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "weir bench: unexpected argument %q\n", fs.Arg(0))
		return c, 2, false
	}
	if err := c.validate(); err != nil {
		fmt.Fprintln(stderr, "weir bench:", err)
		return c, 2, false
	}
	return c, 0, true
}

func (c *benchConfig) validate() error {
	switch c.target {
	case "grpc":
		if c.addr == "" {
			c.addr = "127.0.0.1:8081"
		}
	case "check", "auth":
		if c.addr == "" {
			c.addr = "http://127.0.0.1:8080"
		}
		if !strings.Contains(c.addr, "://") {
			c.addr = "http://" + c.addr
		}
	default:
		return fmt.Errorf("--target %q: want grpc, check or auth", c.target)
	}
	if c.grpcClient != "lean" && c.grpcClient != "grpc-go" {
		return fmt.Errorf("--grpc-client %q: want lean or grpc-go", c.grpcClient)
	}
	if c.target == "grpc" && c.grpcClient == "lean" && leanClient == nil {
		return errors.New("--grpc-client lean: not in this weir, built without the bench tag (go build -tags bench ./cmd/weir); use --grpc-client grpc-go")
	}
	if c.descriptors < 1 || c.descriptors > 64 {
		return fmt.Errorf("--descriptors %d: want 1 to 64", c.descriptors)
	}
	if c.concurrency < 1 || c.keys < 1 || c.abusiveKeys < 1 {
		return fmt.Errorf("--concurrency, --keys and --abusive-keys must be at least 1 (got %d, %d, %d)", c.concurrency, c.keys, c.abusiveKeys)
	}
	if c.duration <= 0 && c.requests <= 0 {
		return fmt.Errorf("--duration %v: want a positive duration or --requests", c.duration)
	}
	if c.rate < 0 {
		return fmt.Errorf("--rate %v: want a positive rate, or 0 for no pacing", c.rate)
	}
	if c.abusive < 0 || c.abusive > 1 {
		return fmt.Errorf("--abusive %v: want a share between 0 and 1", c.abusive)
	}
	if c.dist != "uniform" && c.dist != "zipf" {
		return fmt.Errorf("--dist %q: want uniform or zipf", c.dist)
	}
	if c.dist == "zipf" && c.zipfS <= 1 {
		return fmt.Errorf("--zipf-s %v: must be greater than 1", c.zipfS)
	}
	if c.conns <= 0 || c.conns > c.concurrency {
		c.conns = c.concurrency
	}
	return nil
}

// decision is what one call was answered.
type decision struct {
	allowed bool
	// ruled is set when a rule decided the call; weir allows a call that
	// matches no rule without counting it anywhere.
	ruled bool
}

// caller makes one call for key.
type caller func(ctx context.Context, key string) (decision, error)

// probeKey is the key of the call a run starts with, apart from the keys
// the run counts.
const probeKey = "weir-bench-probe"

// bench drives c's load at its target until the run ends (--duration, or
// --requests calls), writing a progress line to progress every second
// unless c.quiet, and returns the run's summary.
func bench(ctx context.Context, c benchConfig, progress io.Writer) (benchSummary, error) {
	// One call first: when nothing answers, there is nothing to measure.
	ruled, err := c.probe(ctx)
	if err != nil {
		return benchSummary{}, fmt.Errorf("the first call to %s failed, so nothing was measured: %w", c.addr, err)
	}
	callers, closeAll, err := c.callers(ruled)
	if err != nil {
		return benchSummary{}, err
	}
	defer closeAll()

	var counts benchCounts
	hists := make([]*histogram, c.concurrency)
	runCtx := ctx
	if c.requests <= 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, c.duration)
		defer cancel()
	}
	start := time.Now()
	var wg sync.WaitGroup
	turn := new(atomic.Uint64)
	for w := 0; w < c.concurrency; w++ {
		hists[w] = newHistogram()
		wk := newBenchWorker(&c, w, start, turn, callers[w%len(callers)], hists[w])
		wg.Add(1)
		go func() {
			defer wg.Done()
			wk.run(runCtx, &counts)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if !c.quiet {
		showProgress(progress, done, &counts, start)
	} else {
		<-done
	}
	elapsed := time.Since(start)
	if !c.quiet {
		fmt.Fprintln(progress)
	}
	return c.summary(len(callers), elapsed, &counts, hists), nil
}

// benchCounts are a run's decisions so far, shared by its workers.
type benchCounts struct {
	// total counts calls: with --requests those taken from the budget,
	// else those finished.
	total                  atomic.Int64
	allowed, limited, errs atomic.Int64
	ruled                  atomic.Int64
	firstErr               atomic.Value // string: the first error and when it came
}

// benchWorker is one of the run's concurrent callers.
type benchWorker struct {
	c     *benchConfig
	call  caller
	rng   *rand.Rand
	zipf  *rand.Zipf     // nil unless --dist zipf
	turn  *atomic.Uint64 // shared by the run's workers: the next uniform key
	every time.Duration  // time between this worker's calls under --rate, else 0
	next  time.Time      // when this worker's next paced call is due
	start time.Time      // when the run started
	h     *histogram
}

// newBenchWorker returns the w-th worker of a run that started at start,
// taking uniform keys in turn from turn. With --rate, each worker takes
// every concurrency-th slot of a schedule spaced 1/rate apart, so the total
// is paced.
func newBenchWorker(c *benchConfig, w int, start time.Time, turn *atomic.Uint64, call caller, h *histogram) *benchWorker {
	wk := &benchWorker{c: c, call: call, start: start, turn: turn, h: h}
	wk.rng = rand.New(rand.NewPCG(uint64(w)+1, uint64(start.UnixNano())))
	if c.dist == "zipf" {
		wk.zipf = rand.NewZipf(wk.rng, c.zipfS, 1, uint64(c.keys-1))
	}
	if c.rate > 0 {
		wk.every = time.Duration(float64(c.concurrency) * float64(time.Second) / c.rate)
	}
	wk.next = start.Add(time.Duration(float64(w) * float64(time.Second) / max(c.rate, 1)))
	return wk
}

// run calls until ctx ends or the --requests budget is spent, recording
// each call's latency and outcome.
func (wk *benchWorker) run(ctx context.Context, n *benchCounts) {
	c := wk.c
	deadline, hasDeadline := ctx.Deadline()
	for ctx.Err() == nil {
		if !wk.pace(ctx) {
			return
		}
		if c.requests > 0 && n.total.Add(1) > c.requests {
			n.total.Add(-1)
			return
		}
		key := wk.key()
		t0 := time.Now()
		d, err := wk.call(ctx, key)
		// A call cut off by the end of the run is not an error of
		// weir's. On a saturated machine this process's deadline
		// timer can fire late, after the server (whose timer did
		// not) reset the stream, so ask the clock, not only ctx.
		if err != nil && (ctx.Err() != nil || hasDeadline && !time.Now().Before(deadline)) {
			if c.requests > 0 {
				n.total.Add(-1)
			}
			return // the run ended mid-call: not an error of weir's
		}
		if err == nil {
			wk.h.record(time.Since(t0)) // a failure's latency is no decision's
		}
		if c.requests <= 0 {
			n.total.Add(1)
		}
		switch {
		case err != nil:
			n.errs.Add(1)
			n.firstErr.CompareAndSwap(nil, fmt.Sprintf("%v (%.1fs into the run)", err, time.Since(wk.start).Seconds()))
		case d.allowed:
			n.allowed.Add(1)
		default:
			n.limited.Add(1)
		}
		if err == nil && d.ruled {
			n.ruled.Add(1)
		}
	}
}

// pace waits for the worker's next slot under --rate. It reports false
// when ctx ended first.
func (wk *benchWorker) pace(ctx context.Context) bool {
	if wk.every <= 0 {
		return true
	}
	if d := time.Until(wk.slot()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// slot returns when the worker's next paced call is due and moves on to
// the one after.
func (wk *benchWorker) slot() time.Time {
	t := wk.next
	wk.next = wk.next.Add(wk.every)
	return t
}

// key picks the next call's key: an abuser's with probability --abusive,
// else one of --keys: the next in turn (uniform), so that each ordinary key
// calls at the same even rate, --rate × (1 − --abusive) / --keys, and never
// in a burst that chance put together; or at random by --dist zipf.
func (wk *benchWorker) key() string {
	c := wk.c
	switch {
	case c.abusive > 0 && wk.rng.Float64() < c.abusive:
		return "abuser-" + strconv.Itoa(wk.rng.IntN(c.abusiveKeys))
	case wk.zipf != nil:
		return "k" + strconv.FormatUint(wk.zipf.Uint64(), 10)
	default:
		return "k" + strconv.FormatUint((wk.turn.Add(1)-1)%uint64(c.keys), 10)
	}
}

// showProgress writes the decision rate and outcome shares of the last
// second to w every second until done is closed.
func showProgress(w io.Writer, done <-chan struct{}, n *benchCounts, start time.Time) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, lastT := int64(0), start
	for {
		select {
		case <-done:
			return
		case now := <-tick.C:
			total := n.allowed.Load() + n.limited.Load() // errors are no decisions
			rate := float64(total-last) / now.Sub(lastT).Seconds()
			last, lastT = total, now
			fmt.Fprintf(w, "\r  %4.0fs  %9.0f decisions/s  allowed %5.1f%%  limited %5.1f%%  errors %d   ",
				now.Sub(start).Seconds(), rate, pct(n.allowed.Load(), total), pct(n.limited.Load(), total), n.errs.Load())
		}
	}
}

// summary is the result of a run over conns connections that took
// elapsed, with the workers' latency histograms hists.
func (c benchConfig) summary(conns int, elapsed time.Duration, n *benchCounts, hists []*histogram) benchSummary {
	h := newHistogram()
	for _, x := range hists {
		h.merge(x)
	}
	s := benchSummary{
		Target: c.target, Addr: c.addr, Concurrency: c.concurrency, Connections: conns, Keys: c.keys,
		Dist: c.dist, Abusive: c.abusive, Seconds: elapsed.Seconds(),
		Allowed: n.allowed.Load(), Limited: n.limited.Load(), Errors: n.errs.Load(), Ruled: n.ruled.Load(),
		LatencyMS: map[string]float64{},
	}
	if c.target == "grpc" {
		s.GRPCClient = c.grpcClient
	}
	s.Decisions = s.Allowed + s.Limited
	s.Total = s.Decisions + s.Errors
	s.PerSecond = float64(s.Decisions) / elapsed.Seconds()
	s.Failed = 2*s.Errors > s.Total
	if s.Decisions > 0 && s.Ruled == 0 {
		s.Warnings = append(s.Warnings, c.noRuleWarning())
	}
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", .5}, {"p90", .9}, {"p99", .99}, {"p99.9", .999}, {"max", 1}} {
		s.LatencyMS[q.name] = float64(h.quantile(q.q)) / 1e6
	}
	if v, ok := n.firstErr.Load().(string); ok {
		s.FirstError = v
	}
	s.histogram = h
	return s
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// probe makes one call for probeKey and reports whether a rule decided it.
func (c benchConfig) probe(ctx context.Context) (ruled bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var call caller
	if c.target == "grpc" {
		// grpc-go's client reads the descriptors' statuses, which say
		// whether a rule matched; the lean client reads only the verdict.
		cc, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return false, err
		}
		defer cc.Close()
		call = c.grpcCaller(rls.NewRateLimitServiceClient(cc))
	} else {
		cs, closeAll, err := c.callers(false)
		if err != nil {
			return false, err
		}
		defer closeAll()
		call = cs[0]
	}
	d, err := call(ctx, probeKey)
	return d.ruled, err
}

// noRuleWarning says why a run in which no rule decided anything measured
// nothing of weir's limits.
func (c benchConfig) noRuleWarning() string {
	switch c.target {
	case "grpc":
		return fmt.Sprintf("no call was decided by a rule: domain %q has no rule for descriptor client, so every call was allowed without counting anything (weir serve --envoy-config DIR with that domain, or --target check --rule NAME)", c.domain)
	case "auth":
		return fmt.Sprintf("no call was decided by a rule: no rule matches GET %s, so every call was allowed without counting anything (see GET /v1/rules; --path picks the path)", c.path)
	}
	return fmt.Sprintf("no call was decided by a rule %q", c.rule)
}

// descriptorKey is the entry key of a call's i-th descriptor (from 0), as
// the lean client names it: "client", then "client2", "client3", ...
func descriptorKey(i int) string {
	if i == 0 {
		return "client"
	}
	return "client" + strconv.Itoa(i+1)
}

// grpcCaller calls ShouldRateLimit through grpc-go's client.
func (c benchConfig) grpcCaller(client rls.RateLimitServiceClient) caller {
	domain := c.domain
	return func(ctx context.Context, key string) (decision, error) {
		req := &rls.RateLimitRequest{Domain: domain, HitsAddend: 1}
		for i := range max(c.descriptors, 1) {
			req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: descriptorKey(i), Value: key}}})
		}
		resp, err := client.ShouldRateLimit(ctx, req)
		if err != nil {
			return decision{}, err
		}
		d := decision{allowed: resp.OverallCode != rls.RateLimitResponse_OVER_LIMIT}
		d.ruled = !d.allowed
		for _, st := range resp.Statuses {
			d.ruled = d.ruled || st.CurrentLimit != nil
		}
		return d, nil
	}
}

// callers returns the run's callers and the function that closes them.
// ruled is what the probe found: whether a rule decides the calls of a
// client that cannot tell (the lean gRPC client reads only the verdict).
func (c benchConfig) callers(ruled bool) ([]caller, func(), error) {
	switch c.target {
	case "grpc":
		if c.grpcClient == "lean" {
			out, closeAll := leanClient(c, ruled)
			return out, closeAll, nil
		}
		var conns []*grpc.ClientConn
		var out []caller
		for i := 0; i < c.conns; i++ {
			cc, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				for _, x := range conns {
					x.Close()
				}
				return nil, nil, fmt.Errorf("--addr %q: %w", c.addr, err)
			}
			conns = append(conns, cc)
			out = append(out, c.grpcCaller(rls.NewRateLimitServiceClient(cc)))
		}
		return out, func() {
			for _, x := range conns {
				x.Close()
			}
		}, nil
	default:
		tr := &http.Transport{MaxIdleConns: c.concurrency * 2, MaxIdleConnsPerHost: c.concurrency * 2, IdleConnTimeout: 30 * time.Second}
		client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		base := strings.TrimRight(c.addr, "/")
		var call caller
		if c.target == "check" {
			url := base + "/v1/check"
			rule := c.rule
			call = func(ctx context.Context, key string) (decision, error) {
				body, _ := json.Marshal(map[string]any{"rule": rule, "key": key, "hits": 1})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					return decision{}, err
				}
				defer resp.Body.Close()
				var out struct {
					Allowed *bool  `json:"allowed"`
					Error   string `json:"error"`
					Detail  string `json:"detail"`
				}
				derr := json.NewDecoder(resp.Body).Decode(&out)
				switch {
				case derr == nil && out.Allowed != nil && (resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests):
					// A rejection is 200 with allowed: false, or 429.
					return decision{allowed: *out.Allowed && resp.StatusCode == http.StatusOK, ruled: true}, nil
				case resp.StatusCode == http.StatusTooManyRequests:
					return decision{ruled: true}, nil
				}
				msg := out.Error
				if msg == "" {
					msg = out.Detail
				}
				return decision{}, fmt.Errorf("POST %s: status %d %s", url, resp.StatusCode, msg)
			}
		} else {
			url := base + "/v1/auth"
			path := c.path
			call = func(ctx context.Context, key string) (decision, error) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				req.Header.Set("X-Original-URI", path)
				req.Header.Set("X-Original-Method", "GET")
				req.Header.Set("X-Real-IP", keyIP(key))
				req.Header.Set("X-Forwarded-For", keyIP(key))
				resp, err := client.Do(req)
				if err != nil {
					return decision{}, err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					// A rule that decided says so in RateLimit-Policy.
					return decision{allowed: true, ruled: resp.Header.Get("RateLimit-Policy") != "" || resp.Header.Get("X-RateLimit-Limit") != ""}, nil
				case http.StatusForbidden, http.StatusTooManyRequests:
					return decision{ruled: true}, nil
				}
				return decision{}, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
			}
		}
		return []caller{call}, tr.CloseIdleConnections, nil
	}
}

// keyIP maps a key onto an address in 198.18.0.0/15, the range set aside
// for benchmarks, so that /v1/auth sees one client per key.
func keyIP(key string) string {
	var h uint32 = 2166136261
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	h &= 1<<17 - 1
	return fmt.Sprintf("198.%d.%d.%d", 18+h>>16, (h>>8)&255, h&255)
}

func printSummary(w io.Writer, s benchSummary) {
	target := s.Target
	if s.GRPCClient != "" {
		target += " (" + s.GRPCClient + " client)"
	}
	fmt.Fprintf(w, "weir bench: %s %s, %s over %s, %s (%s), abusive share %.0f%%\n\n",
		target, s.Addr, count(s.Concurrency, "caller", "callers"), count(s.Connections, "connection", "connections"), count(s.Keys, "key", "keys"), s.Dist, 100*s.Abusive)
	if s.Failed {
		fmt.Fprintf(w, "  FAILED      %d of %s failed: the figures below measure failures, not weir\n", s.Errors, count(s.Total, "call", "calls"))
	}
	fmt.Fprintf(w, "  decisions   %d in %.1fs = %.0f/s\n", s.Decisions, s.Seconds, s.PerSecond)
	fmt.Fprintf(w, "  allowed     %d (%.1f%%)\n  limited     %d (%.1f%%)\n  errors      %d (%.1f%% of calls, not counted as decisions)\n",
		s.Allowed, pct(s.Allowed, s.Decisions), s.Limited, pct(s.Limited, s.Decisions), s.Errors, pct(s.Errors, s.Total))
	if s.FirstError != "" {
		fmt.Fprintf(w, "  first error %s\n", s.FirstError)
	}
	for _, x := range s.Warnings {
		fmt.Fprintf(w, "  warning     %s\n", x)
	}
	fmt.Fprintf(w, "\n  latency     p50 %.3fms  p90 %.3fms  p99 %.3fms  p99.9 %.3fms  max %.3fms\n\n",
		s.LatencyMS["p50"], s.LatencyMS["p90"], s.LatencyMS["p99"], s.LatencyMS["p99.9"], s.LatencyMS["max"])
	if s.histogram != nil {
		s.histogram.draw(w)
	}
}

// histogram counts latencies in log-spaced buckets: 20 per decade from
// 1µs to 100s, so any quantile is within 12% of the truth.
type histogram struct {
	counts []int64
	max    time.Duration
}

const histPerDecade = 20

func newHistogram() *histogram { return &histogram{counts: make([]int64, 8*histPerDecade+1)} }

func bucketOf(d time.Duration) int {
	us := float64(d) / 1e3
	if us < 1 {
		return 0
	}
	return min(int(math.Log10(us)*histPerDecade)+1, 8*histPerDecade)
}

// upper returns bucket i's upper bound.
func upper(i int) time.Duration {
	return time.Duration(math.Pow(10, float64(i)/histPerDecade) * 1e3)
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(d)]++
	if d > h.max {
		h.max = d
	}
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.max = max(h.max, o.max)
}

func (h *histogram) quantile(q float64) time.Duration {
	var n int64
	for _, c := range h.counts {
		n += c
	}
	if n == 0 {
		return 0
	}
	if q >= 1 {
		return h.max
	}
	rank := int64(math.Ceil(q * float64(n)))
	var seen int64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return min(upper(i), h.max)
		}
	}
	return h.max
}

// draw prints the histogram as text bars, one row per occupied bucket
// group (5 buckets = a factor of ~1.8).
func (h *histogram) draw(w io.Writer) {
	const group = 5
	var rows []struct {
		hi time.Duration
		n  int64
	}
	var peak int64
	first, last := -1, -1
	for i, c := range h.counts {
		if c > 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return
	}
	for i := first - first%group; i <= last; i += group {
		var n int64
		for j := i; j < i+group && j < len(h.counts); j++ {
			n += h.counts[j]
		}
		rows = append(rows, struct {
			hi time.Duration
			n  int64
		}{min(upper(min(i+group-1, len(h.counts)-1)), h.max), n})
		peak = max(peak, n)
	}
	fmt.Fprintln(w, "  latency histogram")
	for _, r := range rows {
		bar := int(math.Round(40 * float64(r.n) / float64(peak)))
		if r.n > 0 && bar == 0 {
			bar = 1
		}
		fmt.Fprintf(w, "  ≤ %9s │%-40s %d\n", r.hi.Round(time.Microsecond), strings.Repeat("█", bar), r.n)
	}
}
