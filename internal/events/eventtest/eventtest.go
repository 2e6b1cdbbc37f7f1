// Package eventtest checks that a store records each threshold event
// exactly once per key, threshold and window, however many instances
// and goroutines decide at once.
package eventtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/events"
)

// Size is how hard Exact drives the stores.
type Size struct {
	Goroutines int // per instance
	Identities int
}

// Exact drives every instance (several stores on one backend, or one
// store given several times) with sz.Goroutines goroutines each, which
// together take each of sz.Identities identities past a limit of 10 per
// hour under rule (thresholds 0.5, 0.8, 1.0), and checks that exactly one
// event per identity, threshold and window was recorded, and one first
// refusal.
func Exact(t *testing.T, rule string, instances []weir.Store, sz Size) {
	t.Helper()
	ctx := context.Background()
	rules := map[string]events.Rule{rule: {Thresholds: []float64{0.5, 0.8, 1.0}}}
	evs := make([]events.Store, len(instances))
	for i, s := range instances {
		e, ok := events.Of(s)
		if !ok {
			t.Fatalf("%T records no events", s)
		}
		if err := e.SetEventRules(rules); err != nil {
			t.Fatal(err)
		}
		evs[i] = e
	}
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Hour}
	const calls = 13 // 10 admitted, 3 refused
	// The work: each identity's calls side by side, so that goroutines
	// race on the same key.
	work := make(chan string, sz.Identities*calls)
	order := rand.Perm(sz.Identities)
	for _, i := range order {
		for range calls {
			work <- weir.Key(rule, fmt.Sprintf("id%d", i))
		}
	}
	close(work)
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	admitted := make([]int64, len(instances))
	var mu sync.Mutex
	for si, s := range instances {
		for range sz.Goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var n int64
				for k := range work {
					res, err := s.Take(ctx, k, l, 1)
					if err != nil {
						select {
						case errs <- err:
						default:
						}
						return
					}
					if res.Allowed {
						n++
					}
				}
				mu.Lock()
				admitted[si] += n
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	var total int64
	for _, n := range admitted {
		total += n
	}
	// Read every event, paging with since.
	var all []events.Event
	since := ""
	for {
		page, err := evs[0].Events(ctx, since, events.MaxList)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range page {
			if want := uint64(len(all) + i + 1); e.Seq != want {
				t.Fatalf("event %d has seq %d: events were dropped or numbered twice", want, e.Seq)
			}
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		since = page[len(page)-1].ID
	}
	type slot struct {
		key       string
		kind      string
		threshold float64
		window    int64
	}
	seen := map[slot]int{}
	perKey := map[string]int{}
	windows := map[int64]bool{}
	for _, e := range all {
		if e.Rule != rule {
			t.Fatalf("event of rule %q, want %q", e.Rule, rule)
		}
		w := e.Time.UnixMicro() / l.Period.Microseconds()
		windows[w] = true
		seen[slot{e.Key, e.Kind, e.Threshold, w}]++
		perKey[e.Key]++
	}
	for s, n := range seen {
		if n != 1 {
			t.Fatalf("%s %s %v in window %d: %d events, want 1", s.key, s.kind, s.threshold, s.window, n)
		}
	}
	if len(windows) == 1 {
		// The usual case: all in one window, so each identity has
		// exactly three thresholds and one refusal, and the limit held.
		if total != int64(sz.Identities)*10 {
			t.Fatalf("admitted %d, want %d", total, sz.Identities*10)
		}
		if len(all) != sz.Identities*4 {
			t.Fatalf("%d events, want %d (3 thresholds and a refusal for each of %d identities)", len(all), sz.Identities*4, sz.Identities)
		}
	}
	for _, i := range order {
		k := fmt.Sprintf("id%d", i)
		if perKey[k] < 4 {
			t.Fatalf("%s: %d events, want at least 4", k, perKey[k])
		}
	}
}
