package server

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
)

// checkGuarantees verifies the space-saving bounds of t against the true
// counts of the stream it saw.
func checkGuarantees(t *testing.T, tk *TopK, truth map[string]int64) {
	t.Helper()
	var n int64
	for _, c := range truth {
		n += c
	}
	if got := tk.Total(); got != n {
		t.Fatalf("Total = %d, want %d", got, n)
	}
	bound := n / int64(tk.K())
	top := tk.Top(0)
	monitored := map[string]bool{}
	for _, e := range top {
		monitored[e.Identity] = true
		tc := truth[e.Identity]
		if e.Count < tc {
			t.Errorf("%s: count %d < true count %d", e.Identity, e.Count, tc)
		}
		if e.Count-e.Error > tc {
			t.Errorf("%s: count-error %d > true count %d", e.Identity, e.Count-e.Error, tc)
		}
		if e.Error > bound {
			t.Errorf("%s: error %d > N/K = %d", e.Identity, e.Error, bound)
		}
	}
	for id, c := range truth {
		if c > bound && !monitored[id] {
			t.Errorf("%s has true count %d > N/K = %d but is not monitored", id, c, bound)
		}
	}
	for i := 1; i < len(top); i++ {
		if top[i-1].Count < top[i].Count {
			t.Fatalf("Top not sorted: %v", top)
		}
	}
}

func TestTopKGuarantees(t *testing.T) {
	for _, tc := range []struct {
		k, keys, events int
		zipf            bool
	}{
		{1, 10, 1000, false},
		{5, 5, 1000, false}, // exact: every key fits
		{10, 1000, 20000, true},
		{16, 100, 5000, false},
		{64, 100000, 100000, true},
	} {
		t.Run(fmt.Sprintf("k%d_keys%d_zipf%t", tc.k, tc.keys, tc.zipf), func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tc.k)))
			var z *rand.Zipf
			if tc.zipf {
				z = rand.NewZipf(r, 1.2, 1, uint64(tc.keys-1))
			}
			tk := NewTopK(tc.k)
			truth := map[string]int64{}
			for range tc.events {
				var i uint64
				if z != nil {
					i = z.Uint64()
				} else {
					i = r.Uint64N(uint64(tc.keys))
				}
				w := int64(1 + r.IntN(3))
				key := "id-" + strconv.FormatUint(i, 10)
				tk.Add(key, w)
				truth[key] += w
			}
			checkGuarantees(t, tk, truth)
			if len(tk.Top(0)) > tc.k {
				t.Fatalf("monitors %d items, bound %d", len(tk.Top(0)), tc.k)
			}
			if tc.keys <= tc.k {
				for _, e := range tk.Top(0) {
					if e.Error != 0 || e.Count != truth[e.Identity] {
						t.Fatalf("with every key monitored counts must be exact: %+v vs %d", e, truth[e.Identity])
					}
				}
			}
		})
	}
}

func TestTopKHeavyHitterFound(t *testing.T) {
	tk := NewTopK(8)
	// One abusive identity among a flood of one-off identities.
	for i := range 10000 {
		tk.Add("noise-"+strconv.Itoa(i), 1)
		if i%4 == 0 {
			tk.Add("10.0.0.66", 1)
		}
	}
	top := tk.Top(3)
	if len(top) != 3 || top[0].Identity != "10.0.0.66" {
		t.Fatalf("heavy hitter not first: %+v", top)
	}
	if top[0].Count < 2500 {
		t.Fatalf("count %d under the true 2500", top[0].Count)
	}
}

func TestTopKIgnoresNonPositiveAndConcurrent(t *testing.T) {
	tk := NewTopK(4)
	tk.Add("a", 0)
	tk.Add("a", -3)
	if tk.Total() != 0 || len(tk.Top(0)) != 0 {
		t.Fatal("non-positive weights must be ignored")
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				tk.Add(strconv.Itoa((g+i)%6), 1)
			}
		}()
	}
	wg.Wait()
	if tk.Total() != 4000 {
		t.Fatalf("total %d", tk.Total())
	}
	if NewTopK(0).K() != 1 {
		t.Fatal("k is at least 1")
	}
}
