package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/weir-dev/weir"
)

// failingReservations are mapReservations that fail while down is set,
// as Redis's reservations do while Redis is.
type failingReservations struct {
	mapReservations
	down atomic.Bool
}

func (r *failingReservations) Put(ctx context.Context, id string, rec []byte, ttl time.Duration) error {
	if r.down.Load() {
		return errors.New("reservations down")
	}
	return r.mapReservations.Put(ctx, id, rec, ttl)
}

func (r *failingReservations) Take(ctx context.Context, id string) ([]byte, bool, error) {
	if r.down.Load() {
		return nil, false, errors.New("reservations down")
	}
	return r.mapReservations.Take(ctx, id)
}

// waitSettled makes calls (which the store answers) until no settlement
// waits for the store.
func waitSettled(t *testing.T, h *harness) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); h.svc.PendingSettlements() > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d settlements still wait for the store", h.svc.PendingSettlements())
		}
		h.call(request("llm", 0, withHits(desc("tenant", "other"), 1))) // a plain charge
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSettleWaitsForTheStore: a settlement the store does not decide is
// made when the store answers again. One whose reservation could not be
// read leaves it where it is, and settles it exactly later (the charge
// past the estimate, or the refund short of it); one whose reservation
// was taken but whose store call the fallback answered owes the charge
// past the estimate, made later, and never refunds late. Settlements kept
// past ReservationTTL are dropped and counted.
func TestSettleWaitsForTheStore(t *testing.T) {
	cfg := parseReserve(t, reserveYAML)
	resv := &failingReservations{}
	var storeDown atomic.Bool
	var h *harness
	h = start(t, cfg, WithReservations(resv),
		WithFallbackDecider(func(ctx context.Context, reqs []weir.Request, res []weir.Result, fallback []string) error {
			if storeDown.Load() {
				for i := range reqs {
					res[i], fallback[i] = weir.Result{Allowed: true}, "allow"
				}
				return nil
			}
			return h.store.Do(ctx, reqs, res)
		}))
	want := func(what string, n int64) {
		t.Helper()
		if got := counted(t, h.st, cfg, "a"); got != n {
			t.Fatalf("%s: counted %d, want %d", what, got, n)
		}
	}
	var ids []string
	for range 4 {
		_, id := reserveCall(t, h.client, "a")
		ids = append(ids, id)
	}
	want("four reserves", 400)

	// The store and its reservations fail: the two settlements wait,
	// their reservations unread.
	storeDown.Store(true)
	resv.down.Store(true)
	settleCall(t, h.client, "a", ids[0], 150)
	settleCall(t, h.client, "a", ids[1], 30)
	// The reservations answer, the store's decisions still fail: the
	// reservations are taken; 170 of 100 owes 70, 10 of 100 refunds
	// nothing later.
	resv.down.Store(false)
	settleCall(t, h.client, "a", ids[2], 170)
	settleCall(t, h.client, "a", ids[3], 10)
	if n := h.svc.PendingSettlements(); n != 3 {
		t.Fatalf("%d settlements wait, want 3", n)
	}
	want("during the outage", 400)

	storeDown.Store(false)
	waitSettled(t, h)
	// 400 reserved, +50 (150 of 100), −70 (30 of 100), +70 (170 of 100),
	// and the refund of 90 (10 of 100) not made.
	want("after the store is back", 450)
	if n := h.svc.UnknownReservations(); n != 0 {
		t.Fatalf("%d unknown reservations", n)
	}
	if len(resv.m) != 0 {
		t.Fatalf("%d reservations left open", len(resv.m))
	}

	// Kept longer than ReservationTTL: dropped, counted, nothing charged.
	_, id := reserveCall(t, h.client, "a")
	storeDown.Store(true)
	resv.down.Store(true)
	settleCall(t, h.client, "a", id, 150)
	h.clk.Add(ReservationTTL + time.Second)
	storeDown.Store(false)
	resv.down.Store(false)
	waitSettled(t, h)
	if n := h.svc.DroppedSettlements(); n != 1 {
		t.Fatalf("%d settlements dropped, want 1", n)
	}
	want("the expired settlement", 550)
}

// TestPendingSettlementsBounded: the settlements kept for the store are
// bounded in number and in the bytes of their keys, which a caller
// chooses: past either, they are dropped and counted.
func TestPendingSettlementsBounded(t *testing.T) {
	cfg := parseReserve(t, reserveYAML)
	outage := func(t *testing.T) *harness {
		resv := &failingReservations{}
		resv.down.Store(true)
		return start(t, cfg, WithReservations(resv),
			WithFallbackDecider(func(ctx context.Context, reqs []weir.Request, res []weir.Result, fallback []string) error {
				for i := range reqs {
					res[i], fallback[i] = weir.Result{Allowed: true}, "allow"
				}
				return nil
			}))
	}
	t.Run("count", func(t *testing.T) {
		h := outage(t)
		for i := range maxPendingSettlements + 5 {
			if _, err := h.svc.Check(context.Background(), request("llm", 0, withHits(desc("tenant", "a", ReservationKey, fmt.Sprint(i)), 7))); err != nil {
				t.Fatal(err)
			}
		}
		if n, d := h.svc.PendingSettlements(), h.svc.DroppedSettlements(); n != maxPendingSettlements || d != 5 {
			t.Fatalf("%d kept and %d dropped, want %d and 5", n, d, maxPendingSettlements)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		h := outage(t)
		// Limit overrides of MaxEntries long entries: every one settles
		// under a key of about 3 KiB (weir.Key hashes a long part).
		long := strings.Repeat("x", MaxEntryValueLen)
		const calls = 1600
		var kv []string
		for j := range MaxEntries - 1 {
			kv = append(kv, fmt.Sprintf("k%d%s", j, long[:MaxEntryKeyLen-3]), long)
		}
		size := 0
		for i := range calls {
			d := withOverride(withHits(desc(append(kv[:len(kv):len(kv)], ReservationKey, fmt.Sprintf("%04d", i))...), 7), 100, typev3.RateLimitUnit_HOUR, 0)
			if _, err := h.svc.Check(context.Background(), request("llm", 0, d)); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				size = h.svc.pend.bytes
			}
		}
		n, dropped := h.svc.PendingSettlements(), h.svc.DroppedSettlements()
		if want := maxPendingBytes / size; n != want || int(dropped) != calls-want {
			t.Fatalf("%d kept and %d dropped, want %d (of %d bytes each) and %d", n, dropped, want, size, calls-want)
		}
	})
}
