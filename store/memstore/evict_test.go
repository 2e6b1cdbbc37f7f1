package memstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// TestFullStoreKeepsEnforcingState: an attacker fills a small store with
// ever new keys whose state lasts a year. A boxed identity stays boxed, and
// an identity at its limit stays refused, however many keys come: only
// state that refuses nothing is evicted for a new key. The boxed identity
// also holds a state under another algorithm that refuses nothing, which
// must not take its box with it when the hand reaches it.
func TestFullStoreKeepsEnforcingState(t *testing.T) {
	const bound = 256
	clock := storetest.NewClock(storetest.Epoch)
	s := memstore.New(memstore.WithClock(clock.Now), memstore.WithMaxKeys(bound))
	ctx := context.Background()
	boxLimit := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute, Block: time.Hour}
	side := weir.Limit{Algorithm: weir.TokenBucket, Rate: 100, Period: time.Second}
	capped := weir.Limit{Algorithm: weir.GCRA, Rate: 1, Period: time.Hour}
	year := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1000, Period: 365 * 24 * time.Hour}

	take := func(key string, l weir.Limit) weir.Result {
		t.Helper()
		r, err := s.Take(ctx, key, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	take("boxed", boxLimit)
	if r := take("boxed", boxLimit); r.Allowed || r.BlockedUntil.IsZero() {
		t.Fatalf("second call: %+v, want a penalty box", r)
	}
	take("boxed", side)
	take("capped", capped)
	if r := take("capped", capped); r.Allowed {
		t.Fatalf("capped: %+v, want refused", r)
	}

	for i := range 20_000 {
		take(fmt.Sprint("attacker-", i), year)
		if got := s.Len(); got > bound {
			t.Fatalf("after %d attacker keys the store holds %d keys, bound %d", i+1, got, bound)
		}
	}
	clock.Advance(2 * time.Minute) // the boxed key's window is over; its box is not

	if r := take("boxed", boxLimit); r.Allowed {
		t.Fatalf("boxed identity admitted after the flood: %+v", r)
	}
	if r := take("capped", capped); r.Allowed {
		t.Fatalf("identity over its limit admitted after the flood: %+v", r)
	}
	if got := s.Len(); got != bound {
		t.Fatalf("the store holds %d keys, want it full at %d", got, bound)
	}
}

// TestFullStoreOfEnforcingState: when every key held refuses (each at its
// limit), a new key still evicts one and is counted: the bound holds and
// nothing goes uncounted.
func TestFullStoreOfEnforcingState(t *testing.T) {
	const bound = 64
	clock := storetest.NewClock(storetest.Epoch)
	s := memstore.New(memstore.WithClock(clock.Now), memstore.WithMaxKeys(bound))
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
	for i := range 4 * bound {
		key := fmt.Sprint("k", i)
		for call, want := range []bool{true, false} {
			r, err := s.Take(ctx, key, l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed != want {
				t.Fatalf("%s call %d: allowed %v, want %v", key, call, r.Allowed, want)
			}
		}
		if got := s.Len(); got > bound {
			t.Fatalf("holds %d keys, bound %d", got, bound)
		}
	}
}
