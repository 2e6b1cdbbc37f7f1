package memstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/override"

	"github.com/weir-dev/weir/storetest"
)

func TestOverrides(t *testing.T) {
	storetest.RunOverrides(t, func(t *testing.T) storetest.Harness {
		clock := storetest.NewClock(storetest.Epoch)
		return storetest.Harness{Store: New(WithClock(clock.Now)), Clock: clock}
	})
}

// TestOverrideBound: an override beyond the store's bound is refused
// with an error naming the bound, before anything is written; replacing
// one at the bound is not refused; 16 goroutines setting 160 overrides
// store exactly the bound's.
func TestOverrideBound(t *testing.T) {
	ctx := context.Background()
	s := New()
	s.ovrMax = 20
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: time.Hour}
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				key := fmt.Sprintf("r:%d-%d", g, i)
				if i%3 == 0 {
					key += "*"
				}
				err := s.SetOverride(ctx, override.Override{Key: key, Limit: l})
				var oe *override.Error
				switch {
				case err == nil:
					ok.Add(1)
				case errors.As(err, &oe) && oe.Field == "key" && strings.Contains(oe.Reason, "(20)"):
					refused.Add(1)
				default:
					t.Errorf("SetOverride(%s) = %v; want nil or the bound's error", key, err)
				}
			}
		}()
	}
	wg.Wait()
	list, err := s.Overrides(ctx, "")
	if err != nil || len(list) != 20 || ok.Load() != 20 || refused.Load() != 140 {
		t.Fatalf("stored %d (%v), %d set, %d refused; want 20, 20, 140", len(list), err, ok.Load(), refused.Load())
	}
	if log, _ := s.OverrideLog(ctx, 1000); len(log) != 20 {
		t.Fatalf("the log holds %d changes, want the 20 made", len(log))
	}
	l.Rate = 6
	if err := s.SetOverride(ctx, override.Override{Key: list[0].Key, Limit: l}); err != nil {
		t.Fatalf("replacing an override at the bound: %v", err)
	}
	if err := s.SetOverride(ctx, override.Override{Key: "r:new", Limit: l}); err == nil || !strings.Contains(err.Error(), "the most it keeps (20)") {
		t.Fatalf("an override beyond the bound: %v", err)
	}
	if list, _ := s.Overrides(ctx, "r:new"); len(list) != 0 {
		t.Fatalf("the refused override was stored: %+v", list)
	}
	if r, err := s.Take(ctx, "r:new", weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: time.Hour}, 0); err != nil || r.Limit != 5 {
		t.Fatalf("the refused override binds: %+v, %v", r, err)
	}
}
