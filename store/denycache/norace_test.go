//go:build !race

package denycache

import (
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// TestHitAllocs: an answer from memory allocates nothing, through Take
// and Do of one request (the race detector's own allocations would count,
// hence the build tag).
func TestHitAllocs(t *testing.T) {
	s, err := New(memstore.New(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
	mustTake(t, s, "k", l, 1)
	mustTake(t, s, "k", l, 1)
	reqs := []weir.Request{{Key: "k", Limit: l, N: 1}}
	res := make([]weir.Result, 1)
	for name, f := range map[string]func(){
		"Take": func() { _, _ = s.Take(ctx, "k", l, 1) },
		"Do":   func() { _ = s.Do(ctx, reqs, res) },
	} {
		h := s.hits()
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocations per hit", name, n)
		}
		if s.hits() <= h {
			t.Errorf("%s: not answered from memory", name)
		}
	}
}
