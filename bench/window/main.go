// Command window measures how far weir's sliding_window counter strays from
// the exact sliding log on a seeded, described trace.
//
// The trace: -clients keys, each a Poisson process whose rate is drawn from
// a log-normal distribution with median -rate per minute and shape -sigma
// (so about half the clients ask for more than the limit and half for
// less), over -minutes minutes. Every request asks for one unit of a
// -rate per minute limit. The same trace runs through memstore under
// sliding_log (exact: no trailing minute ever holds more than the limit)
// and under sliding_window, plain and with each -buckets count, on an
// injected clock, so the output depends on the flags alone. Every key
// starts empty at the same instant, and a heavy client's first burst is
// the counters' worst moment, so the first -warmup minutes are run but not
// measured (-warmup 0 measures them).
//
// For each algorithm it reports, per seed:
//
//   - admitted: the total admissions, and their excess over the log's;
//   - worst: the largest number of admissions any key holds in a trailing
//     period ending at one of its admissions (the log's is at most the
//     limit), and that excess over the limit;
//   - over: the share of admissions that landed while the exact trailing
//     count of the key's own admissions was already at or above the limit;
//   - keys: how many keys ever held more than the limit in a trailing period.
//
// Run it with `make bench-window` (or `cd bench && go run ./window`).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// trace describes a workload.
type trace struct {
	Seed    uint64
	Clients int
	Minutes int
	Rate    int64   // the limit per minute, and the clients' median rate
	Sigma   float64 // log-normal shape of the clients' rates
	Warmup  int     // minutes run but not measured, so that no key starts empty
}

// event is one request: a client's key index at an instant in µs.
type event struct {
	t      int64
	client int32
}

// start is the trace's first instant: a fixed epoch time, not aligned to a
// minute, so that the counters' windows start part way into the trace.
const start = 1_700_000_000_123_456

// events generates t's requests in time order.
func (t trace) events() []event {
	rng := rand.New(rand.NewPCG(t.Seed, 0x77656972)) // "weir"
	end := float64(t.Minutes) * 60e6
	var evs []event
	for c := 0; c < t.Clients; c++ {
		perMin := float64(t.Rate) * math.Exp(t.Sigma*rng.NormFloat64())
		meanGap := 60e6 / perMin // µs
		for at := rng.ExpFloat64() * meanGap; at < end; at += rng.ExpFloat64() * meanGap {
			evs = append(evs, event{start + int64(at), int32(c)})
		}
	}
	slices.SortStableFunc(evs, func(a, b event) int {
		if a.t != b.t {
			if a.t < b.t {
				return -1
			}
			return 1
		}
		return int(a.client - b.client)
	})
	return evs
}

// stats is what one algorithm made of a trace.
type stats struct {
	Admitted int64
	Worst    int64 // the most admissions one key held in a trailing period
	Over     int64 // admissions that found the key's exact trailing count >= the limit
	KeysOver int   // keys that ever held more than the limit in a trailing period
}

// run replays evs through memstore under l and measures the admissions
// from the instant from on (earlier ones count only in trailing periods).
func run(evs []event, clients int, l weir.Limit, from int64) (stats, error) {
	var now int64
	st := memstore.New(memstore.WithClock(func() time.Time { return time.UnixMicro(now) }))
	lim := weir.NewLimiter(st)
	ctx := context.Background()
	keys := make([]string, clients)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	admitted := make([][]int64, clients)
	for _, ev := range evs {
		now = ev.t
		res, err := lim.Allow(ctx, keys[ev.client], l)
		if err != nil {
			return stats{}, fmt.Errorf("%s at %dµs: %w", keys[ev.client], ev.t, err)
		}
		if res.Allowed {
			admitted[ev.client] = append(admitted[ev.client], ev.t)
		}
	}
	var s stats
	period := l.Period.Microseconds()
	for _, ts := range admitted {
		// An admission at t counts the key's admissions in (t−P, t], its own
		// included, as sliding_log does.
		lo, over := 0, false
		for i, t := range ts {
			for ts[lo] <= t-period {
				lo++
			}
			if t < from {
				continue
			}
			s.Admitted++
			held := int64(i - lo + 1)
			s.Worst = max(s.Worst, held)
			if held > l.Rate {
				s.Over++
				over = true
			}
		}
		if over {
			s.KeysOver++
		}
	}
	return s, nil
}

// variant is one algorithm under test.
type variant struct {
	name  string
	limit weir.Limit
}

// defaultBuckets is -buckets' default.
const defaultBuckets = "2,3,4,6,12,30,60"

// withBuckets returns l split into n sub-windows.
func withBuckets(l weir.Limit, n int) weir.Limit {
	l.Buckets = int64(n)
	return l
}

func variants(rate int64, buckets []int) []variant {
	vs := []variant{
		{string(weir.SlidingLog), weir.Limit{Algorithm: weir.SlidingLog, Rate: rate, Period: time.Minute}},
		{string(weir.SlidingWindow), weir.Limit{Algorithm: weir.SlidingWindow, Rate: rate, Period: time.Minute}},
	}
	for _, n := range buckets {
		vs = append(vs, variant{
			fmt.Sprintf("sliding_window buckets %d", n),
			withBuckets(weir.Limit{Algorithm: weir.SlidingWindow, Rate: rate, Period: time.Minute}, n),
		})
	}
	return vs
}

// report runs every variant over the trace of each seed and writes a table.
func report(w io.Writer, base trace, seeds int, buckets []int) error {
	vs := variants(base.Rate, buckets)
	for _, v := range vs {
		if err := v.limit.Validate(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "trace: %d clients, Poisson, rates log-normal with median %d/min and sigma %.2f, %d minutes, the first %d not measured; limit %d/min\n\n",
		base.Clients, base.Rate, base.Sigma, base.Minutes, base.Warmup, base.Rate)
	fmt.Fprintf(w, "%-4s  %-26s  %9s  %9s  %6s  %9s  %12s  %5s\n", "seed", "algorithm", "requests", "admitted", "vs log", "worst", "over", "keys")
	type span struct{ lo, hi float64 }
	ranges := make([][3]span, len(vs))
	for i := 0; i < seeds; i++ {
		tr := base
		tr.Seed = base.Seed + uint64(i)
		evs := tr.events()
		var exact stats
		for j, v := range vs {
			s, err := run(evs, tr.Clients, v.limit, start+int64(tr.Warmup)*60e6)
			if err != nil {
				return err
			}
			if j == 0 {
				exact = s
				if s.Worst > base.Rate || s.Over != 0 {
					return fmt.Errorf("sliding_log held %d in a trailing minute (limit %d): the measurement is broken", s.Worst, base.Rate)
				}
			}
			vsLog := 100 * float64(s.Admitted-exact.Admitted) / float64(exact.Admitted)
			excess := 100 * float64(s.Worst-base.Rate) / float64(base.Rate)
			over := 100 * float64(s.Over) / float64(s.Admitted)
			fmt.Fprintf(w, "%-4d  %-26s  %9d  %9d  %+5.2f%%  %4d %+3.0f%%  %5d %5.2f%%  %5d\n",
				tr.Seed, v.name, len(evs), s.Admitted, vsLog, s.Worst, excess, s.Over, over, s.KeysOver)
			for k, x := range []float64{vsLog, excess, over} {
				r := &ranges[j][k]
				if i == 0 || x < r.lo {
					r.lo = x
				}
				if i == 0 || x > r.hi {
					r.hi = x
				}
			}
		}
	}
	fmt.Fprintf(w, "\nover %d seeds (%d..%d):\n", seeds, base.Seed, base.Seed+uint64(seeds)-1)
	fmt.Fprintf(w, "%-26s  %-16s  %-16s  %-14s\n", "algorithm", "admitted vs log", "worst excess", "over")
	for j, v := range vs {
		r := ranges[j]
		fmt.Fprintf(w, "%-26s  %+6.2f..%+6.2f%%  %+5.1f..%+5.1f%%  %5.2f..%5.2f%%\n",
			v.name, r[0].lo, r[0].hi, r[1].lo, r[1].hi, r[2].lo, r[2].hi)
	}
	return nil
}

func parseBuckets(s string) ([]int, error) {
	var out []int
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("-buckets: %q is not a whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func main() {
	var tr trace
	flag.Uint64Var(&tr.Seed, "seed", 1, "first seed")
	seeds := flag.Int("seeds", 5, "number of seeds (traces) to run, from -seed on")
	flag.IntVar(&tr.Clients, "clients", 200, "number of clients (keys)")
	flag.IntVar(&tr.Minutes, "minutes", 60, "length of the trace in minutes")
	flag.Int64Var(&tr.Rate, "rate", 100, "the limit per minute, and the clients' median rate")
	flag.Float64Var(&tr.Sigma, "sigma", 0.5, "log-normal shape of the clients' rates")
	flag.IntVar(&tr.Warmup, "warmup", 2, "minutes at the start that are run but not measured (every key starts empty)")
	bucketsFlag := flag.String("buckets", defaultBuckets, "bucket counts of the bucketed sliding_window to measure, comma-separated")
	flag.Parse()
	buckets, err := parseBuckets(*bucketsFlag)
	if err == nil && (tr.Clients <= 0 || tr.Minutes <= 0 || tr.Rate <= 0 || *seeds <= 0 || tr.Sigma < 0 || tr.Warmup < 0 || tr.Warmup >= tr.Minutes) {
		err = fmt.Errorf("-clients %d, -minutes %d, -rate %d and -seeds %d must be positive, -sigma %g not negative, and -warmup %d from 0 to fewer than -minutes",
			tr.Clients, tr.Minutes, tr.Rate, *seeds, tr.Sigma, tr.Warmup)
	}
	if err == nil {
		err = report(os.Stdout, tr, *seeds, buckets)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "window:", err)
		os.Exit(1)
	}
}
