// Command overload measures weir's overload protection (make
// bench-overload): a simulated backend of fixed capacity (-capacity calls
// in flight, -service each; more wait in line) behind policy.Middleware,
// offered 3× and 5× what it can serve, open loop (Poisson arrivals, each
// request on its own goroutine, a client giving up after -timeout), with
// -critical of the requests marked critical and -sheddable sheddable, the
// rest normal. It prints, for no protection, concurrency: adaptive with
// max_wait and concurrency: adaptive with nothing but priority and
// reserve, the
// goodput (successes within the timeout per second, as a share of
// capacity), the p50 and p99 latency of successful requests and the share
// of critical requests served. The requests go straight to the handler,
// without a network, so that the load generator costs little.
package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/policy"
)

var (
	capacity  = flag.Int("capacity", 50, "calls the backend serves at once")
	service   = flag.Duration("service", 20*time.Millisecond, "time each call takes")
	duration  = flag.Duration("duration", 10*time.Second, "measured time of each run")
	warmup    = flag.Duration("warmup", 3*time.Second, "time before measuring, for the adaptive limit to settle")
	timeout   = flag.Duration("timeout", time.Second, "how long a client waits")
	critical  = flag.Float64("critical", 0.2, "share of critical requests")
	sheddable = flag.Float64("sheddable", 0.3, "share of sheddable requests")
	loads     = flag.String("loads", "3,5", "offered loads, as multiples of capacity")
	real      = flag.Bool("real", false, "run on the wall clock through policy.Middleware instead of simulating")
	maxWait   = flag.Duration("max-wait", 20*time.Millisecond, "max_wait of the \"adaptive+max_wait\" rule: how long a critical request waits for a slot")
	seed      = flag.Uint64("seed", 1, "seed of the arrivals and service times")
	jitter    = flag.Float64("jitter", 0.1, "simulation: sigma of the lognormal factor of each call's service time")
	trace     = flag.Bool("trace", false, "simulation: print why critical requests were lost")
	idealWait = flag.Duration("ideal-wait", 0, "simulation: how long the \"ideal\" queue lets a critical request wait (default -service)")
	seeds     = flag.Int("seeds", 0, "simulation: run seeds 1 to n and print each figure's min, median and max")
)

// backend serves capacity calls at once, each taking service; the others
// wait in line until their client gives up.
func backend() http.Handler {
	slots := make(chan struct{}, *capacity)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
		case <-r.Context().Done():
			w.WriteHeader(http.StatusGatewayTimeout)
			return
		}
		time.Sleep(*service)
		<-slots
	})
}

type result struct {
	offered, ok, critOffered, critOK int
	otherOK                          int // normal and sheddable served
	lat                              []time.Duration
	lost                             map[string]int // simulation, -trace: critical requests lost, by cause
	idle, idleWaiting                float64        // simulation, -trace: idle worker-seconds, and those while critical requests waited
}

func modeConfig(mode string) string {
	switch mode {
	case "adaptive+max_wait":
		return fmt.Sprintf("protect:\n  - name: api\n    concurrency: adaptive\n    priority: header:X-Priority\n    reserve: 20%%\n    max_wait: %s\n", *maxWait)
	case "adaptive":
		return "protect:\n  - name: api\n    concurrency: adaptive\n    priority: header:X-Priority\n    reserve: 20%\n"
	}
	return "rules: []\n"
}

// runReal offers rate requests per second to mode's handler for warmup +
// duration and measures those that arrived after the warmup.
func runReal(mode string, rate float64) (result, string) {
	cfg, err := policy.Parse([]byte(modeConfig(mode)), mode)
	if err != nil {
		panic(err)
	}
	p, err := policy.New(cfg, nil)
	if err != nil {
		panic(err)
	}
	h := policy.Middleware(p)(backend())
	rng := rand.New(rand.NewPCG(*seed, 2))
	var mu sync.Mutex
	var res result
	var wg sync.WaitGroup
	start := time.Now()
	measureFrom := start.Add(*warmup)
	end := measureFrom.Add(*duration)
	next := start
	var inflight atomic.Int64
	for {
		now := time.Now()
		if !now.Before(end) {
			break
		}
		for !next.After(now) && next.Before(end) {
			u := rng.Float64()
			crit, shed := u < *critical, u >= *critical && u < *critical+*sheddable
			measured := !next.Before(measureFrom)
			next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
			wg.Add(1)
			inflight.Add(1)
			go func() {
				defer wg.Done()
				defer inflight.Add(-1)
				ctx, cancel := context.WithTimeout(context.Background(), *timeout)
				defer cancel()
				req := httptest.NewRequestWithContext(ctx, "GET", "/api/x", nil)
				req.RemoteAddr = "192.0.2.1:1234"
				switch {
				case crit:
					req.Header.Set("X-Priority", "critical")
				case shed:
					req.Header.Set("X-Priority", "sheddable")
				}
				rec := httptest.NewRecorder()
				t0 := time.Now()
				h.ServeHTTP(rec, req)
				lat := time.Since(t0)
				if !measured {
					return
				}
				ok := rec.Code == http.StatusOK && lat <= *timeout
				mu.Lock()
				res.offered++
				if crit {
					res.critOffered++
				}
				if ok {
					res.ok++
					res.lat = append(res.lat, lat)
					if crit {
						res.critOK++
					}
				}
				mu.Unlock()
			}()
		}
		time.Sleep(200 * time.Microsecond)
	}
	wg.Wait()
	limit := "–"
	if st := p.ProtectStats(); len(st) > 0 {
		limit = fmt.Sprint(st[0].Limit)
	}
	return res, limit
}

func pct(lat []time.Duration, q float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	return lat[min(len(lat)-1, int(q*float64(len(lat))))]
}

func ms(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f ms", float64(d)/1e6)
}

func main() {
	flag.Parse()
	capRate := float64(*capacity) / service.Seconds()
	fmt.Printf("backend: %d in flight, %v each: capacity %.0f req/s; %v measured after %v warmup; %.0f%% critical, %.0f%% sheddable, the rest normal; client timeout %v\n\n",
		*capacity, *service, capRate, *duration, *warmup, *critical*100, *sheddable*100, *timeout)
	mode := "simulated on a virtual clock"
	if *real {
		mode = "on the wall clock, through policy.Middleware"
	}
	fmt.Println("run:", mode)
	run := simulate
	if *real {
		run = runReal
	}
	var factors []float64
	if _, err := fmt.Sscanf(*loads, "%g,%g", new(float64), new(float64)); err == nil {
		var a, b float64
		fmt.Sscanf(*loads, "%g,%g", &a, &b)
		factors = []float64{a, b}
	} else {
		var a float64
		if _, err := fmt.Sscanf(*loads, "%g", &a); err != nil {
			fmt.Fprintln(os.Stderr, "bad -loads:", *loads)
			os.Exit(2)
		}
		factors = []float64{a}
	}
	if *seeds > 0 && !*real {
		manySeeds(factors, capRate)
		return
	}
	base, _ := run("none", capRate/2)
	unloadedP99 := pct(base.lat, 0.99)
	fmt.Printf("unloaded (0.5× capacity, no protection): p50 %s, p99 %s\n\n", ms(pct(base.lat, 0.5)), ms(unloadedP99))
	fmt.Println("| offered | protection | goodput (share of capacity) | p50 ok | p99 ok | p99 / unloaded p99 | critical served | final limit |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, f := range factors {
		modes := []string{"none", "adaptive+max_wait", "adaptive"}
		if !*real {
			modes = append(modes, "ideal")
		}
		for _, mode := range modes {
			r, limit := run(mode, capRate*f)
			good := float64(r.ok) / duration.Seconds() / capRate
			crit := 0.0
			if r.critOffered > 0 {
				crit = float64(r.critOK) / float64(r.critOffered)
			}
			p99 := pct(r.lat, 0.99)
			ratio := "–"
			if unloadedP99 > 0 && p99 > 0 {
				ratio = fmt.Sprintf("%.2f", float64(p99)/float64(unloadedP99))
			}
			fmt.Printf("| %g× | %s | %.1f%% | %s | %s | %s | %.2f%% | %s |\n",
				f, mode, good*100, ms(pct(r.lat, 0.5)), ms(p99), ratio, crit*100, limit)
			if r.lost != nil && mode != "none" {
				fmt.Printf("  critical offered %d, served %d; normal and sheddable served %d; idle %.0f calls, %.0f of them while critical requests waited; lost:",
					r.critOffered, r.critOK, r.otherOK, r.idle/service.Seconds(), r.idleWaiting/service.Seconds())
				for _, k := range slices.Sorted(maps.Keys(r.lost)) {
					fmt.Printf(" %s %d;", k, r.lost[k])
				}
				fmt.Println()
			}
		}
	}
}

// manySeeds simulates seeds 1 to -seeds and prints, for each load and
// protection, the min, median and max over the seeds of the goodput, the
// p99 ÷ the seed's unloaded p99 and the share of critical requests
// served, how many seeds served under 99% of them, and how far the share
// strays from the ideal queue's on the same arrivals.
func manySeeds(factors []float64, capRate float64) {
	modes := []string{"adaptive+max_wait", "adaptive", "ideal"}
	type figs struct{ good, ratio, crit float64 }
	out := make([][][]figs, len(factors)) // [factor][mode][seed]
	for i := range out {
		out[i] = make([][]figs, len(modes))
		for j := range out[i] {
			out[i][j] = make([]figs, *seeds)
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for sd := range *seeds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			base, _ := simulateSeed("none", capRate/2, uint64(sd+1))
			unloaded := pct(base.lat, 0.99)
			for i, f := range factors {
				for j, mode := range modes {
					r, _ := simulateSeed(mode, capRate*f, uint64(sd+1))
					x := figs{good: float64(r.ok) / duration.Seconds() / capRate}
					if p99 := pct(r.lat, 0.99); unloaded > 0 {
						x.ratio = float64(p99) / float64(unloaded)
					}
					if r.critOffered > 0 {
						x.crit = float64(r.critOK) / float64(r.critOffered)
					}
					out[i][j][sd] = x
				}
			}
		}()
	}
	wg.Wait()
	mmm := func(xs []float64, format string) string {
		slices.Sort(xs)
		return fmt.Sprintf(format+"–"+format+"–"+format, xs[0], xs[len(xs)/2], xs[len(xs)-1])
	}
	fmt.Printf("seeds 1–%d: min–median–max\n\n", *seeds)
	fmt.Println("| offered | protection | goodput | p99 ÷ unloaded p99 | critical served | seeds under 99% critical | critical served − ideal's |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for i, f := range factors {
		for j, mode := range modes {
			var good, ratio, crit, diff []float64
			under := 0
			for sd, x := range out[i][j] {
				good, ratio, crit = append(good, x.good*100), append(ratio, x.ratio), append(crit, x.crit*100)
				diff = append(diff, (x.crit-out[i][len(modes)-1][sd].crit)*100)
				if x.crit < 0.99 {
					under++
				}
			}
			d := mmm(diff, "%+.2f")
			if mode == "ideal" {
				d = "–"
			}
			fmt.Printf("| %g× | %s | %s%% | %s | %s%% | %d | %s |\n", f, mode, mmm(good, "%.1f"), mmm(ratio, "%.2f"), mmm(crit, "%.2f"), under, d)
		}
	}
}
