// Command cpuop measures CPU time per decision (thread CPU time, not wall
// time), one goroutine, one key, for x/time/rate and weir's memstore: a
// figure that a busy shared machine disturbs less than ns/op.
package main

import (
	"context"
	"flag"
	"fmt"
	"hash/maphash"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
	"golang.org/x/time/rate"
)

func threadCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func measure(n int, f func()) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := threadCPU()
	for i := 0; i < n; i++ {
		f()
	}
	return float64(threadCPU()-start) / float64(n)
}

// parallel measures two goroutines deciding over 100k keys, each on its
// own thread: CPU time per decision, and half of it, the wall time per
// decision two busy cores would give.
func parallel(n, rounds int) {
	const nkeys = 100_000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	ctx := context.Background()
	// The floor: picking a random key among 100k and hashing it, which
	// every decision does first (a cache miss for the key's bytes here;
	// a server's key, just built from the request, is in cache).
	seed := maphash.MakeSeed()
	var sink [2][16]uint64 // 128 bytes apart: no shared cache line
	m := median2(n, rounds, func(g int) func() {
		i := uint64(g*7919 + 1)
		return func() {
			i = i*6364136223846793005 + 1442695040888963407
			sink[g][0] += maphash.String(seed, keys[(i>>33)%nkeys])
		}
	})
	fmt.Printf("%-28s %6.1f ns CPU/op over 100k keys, 2 goroutines\n", "floor: pick and hash a key", m)
	for _, a := range []weir.Algorithm{weir.TokenBucket, weir.GCRA, weir.FixedWindow} {
		lim := weir.NewLimiter(memstore.New())
		l := weir.Limit{Algorithm: a, Rate: 100_000, Period: 24 * time.Hour}
		for _, k := range keys {
			lim.Allow(ctx, k, l)
		}
		m := median2(n, rounds, func(g int) func() {
			i := uint64(g*7919 + 1)
			return func() {
				i = i*6364136223846793005 + 1442695040888963407
				lim.Allow(ctx, keys[(i>>33)%nkeys], l)
			}
		})
		fmt.Printf("%-28s %6.1f ns CPU/op over 100k keys, 2 goroutines (%.1f ns per decision on 2 cores)\n", "memstore "+string(a), m, m/2)
	}
}

// median2 runs f(0) and f(1) on two goroutines, n/2 calls each, rounds
// times, and returns the median of the rounds' mean CPU time per call.
func median2(n, rounds int, f func(g int) func()) float64 {
	var meds []float64
	for r := 0; r < rounds; r++ {
		var wg sync.WaitGroup
		cpu := make([]float64, 2)
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				cpu[g] = measure(n/2, f(g))
			}(g)
		}
		wg.Wait()
		meds = append(meds, (cpu[0]+cpu[1])/2)
	}
	sort.Float64s(meds)
	return meds[len(meds)/2]
}

func main() {
	n := flag.Int("n", 5_000_000, "decisions per measurement")
	rounds := flag.Int("rounds", 7, "rounds (the median is printed)")
	par := flag.Bool("parallel", true, "also measure two goroutines over 100k keys")
	flag.Parse()
	x := rate.NewLimiter(rate.Limit(1e9), 1e9)
	ctx := context.Background()
	subjects := []struct {
		name string
		f    func()
	}{{"x/time/rate Allow", func() { x.Allow() }}}
	for _, a := range []weir.Algorithm{weir.TokenBucket, weir.GCRA, weir.FixedWindow} {
		lim := weir.NewLimiter(memstore.New())
		l := weir.Limit{Algorithm: a, Rate: 1e9, Period: time.Second}
		subjects = append(subjects, struct {
			name string
			f    func()
		}{"memstore " + string(a), func() { lim.Allow(ctx, "key", l) }})
	}
	res := make([][]float64, len(subjects))
	for r := 0; r < *rounds; r++ {
		for i, s := range subjects {
			res[i] = append(res[i], measure(*n, s.f))
		}
	}
	if *par {
		parallel(*n, *rounds)
	}
	base := 0.0
	for i, s := range subjects {
		sort.Float64s(res[i])
		med := res[i][len(res[i])/2]
		if i == 0 {
			base = med
		}
		fmt.Printf("%-28s %6.1f ns CPU/op (min %.1f)  %.2f×\n", s.name, med, res[i][0], med/base)
	}
}
