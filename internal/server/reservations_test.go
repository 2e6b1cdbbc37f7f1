package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/storetest"
)

// TestReservationsAcrossInstances: two instances on one Redis share their
// reservations: what one reserved, the other settles, each exactly once
// however the instances race for it, and the limit counts every unit.
func TestReservationsAcrossInstances(t *testing.T) {
	r := redistest.Standalone(t)
	// 100 an hour: the bucket refills one unit in 36 s, so however slow
	// the machine, no refill lands between the reserves and the checks.
	cfg := WithConfig(mustParse(t, "rules:\n  - name: tokens\n    limit: 100/h\n    algorithm: token_bucket\nstore:\n  timeout: 2s\n"))
	_, baseA := newRedisServer(t, r.Addr, "a", cfg)
	_, baseB := newRedisServer(t, r.Addr, "b", cfg)
	const n = 20 // reservations of 5 under tokens: 100/m, all admitted
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			code, d, b := post(t, baseA+"/v1/reserve", `{"rule":"tokens","key":"shared","estimate":5}`)
			if code != 200 || d["allowed"] != true {
				t.Errorf("reserve %d on a: %d %s", i, code, b)
				return
			}
			ids[i], _ = d["reservation"].(string)
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if _, d, b := post(t, baseB+"/v1/reserve", `{"rule":"tokens","key":"shared","estimate":1}`); d["allowed"] != false {
		t.Fatalf("a 101st unit admitted on b: %s", b)
	}
	// The first half settles at 2 on b, which did not reserve them.
	for _, id := range ids[:n/2] {
		if code, _, b := post(t, baseB+"/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":2}`, id)); code != 200 {
			t.Fatalf("settle on b what a reserved: %d %s", code, b)
		}
	}
	// The other half at 2 on both instances at once: one settle of each
	// succeeds, the other is a 404.
	var mu sync.Mutex
	ok := map[string]int{}
	for _, id := range ids[n/2:] {
		for _, base := range []string{baseA, baseB} {
			wg.Go(func() {
				code, _, b := post(t, base+"/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":2}`, id))
				switch code {
				case 200:
					mu.Lock()
					ok[id]++
					mu.Unlock()
				case 404:
				default:
					t.Errorf("settle %s: %d %s", id, code, b)
				}
			})
		}
	}
	wg.Wait()
	for _, id := range ids[n/2:] {
		if ok[id] != 1 {
			t.Errorf("reservation %s settled %d times, want once", id, ok[id])
		}
	}
	// 20 settled at 2 of 5: 40 taken, 60 remain (the refunds come back
	// at once).
	if _, d, b := post(t, baseB+"/v1/check", `{"rule":"tokens","key":"shared","hits":0}`); d["remaining"].(float64) != 60 {
		t.Fatalf("after settling 20 reservations of 5 at 2: %s, want 60 remaining", b)
	}
}

// TestReservationsBoundedInMemory: without Redis the open reservations
// sit in a bounded map: when it is full of live ones, a new reservation
// is refused with a 503 that says so, and its estimate is given back; a
// settled or expired one makes room.
func TestReservationsBoundedInMemory(t *testing.T) {
	srv, ts := newTestServer(t, WithConfig(mustParse(t, debtRules)))
	srv.resv = newMemReservations(srv.now, 3)
	var ids []string
	for range 3 {
		_, d, b := post(t, ts.URL+"/v1/reserve", `{"rule":"daily","key":"k","estimate":10}`)
		id, _ := d["reservation"].(string)
		if id == "" {
			t.Fatalf("reserve: %s", b)
		}
		ids = append(ids, id)
	}
	code, _, b := post(t, ts.URL+"/v1/reserve", `{"rule":"daily","key":"k","estimate":10}`)
	if code != 503 || !strings.Contains(b, "too many open reservations") || !strings.Contains(b, "settle some first") {
		t.Fatalf("a 4th open reservation of 3: %d %s, want 503 naming the bound", code, b)
	}
	if _, d, _ := post(t, ts.URL+"/v1/check", `{"rule":"daily","key":"k","hits":0}`); d["remaining"].(float64) != 970 {
		t.Fatalf("a refused reservation kept its estimate: %v remaining, want 970", d["remaining"])
	}
	if code, _, b := post(t, ts.URL+"/v1/settle", `{"reservation":"`+ids[0]+`","actual":10}`); code != 200 {
		t.Fatalf("settle: %d %s", code, b)
	}
	if _, d, b := post(t, ts.URL+"/v1/reserve", `{"rule":"daily","key":"k","estimate":10}`); d["reservation"] == "" {
		t.Fatalf("a settled reservation made no room: %s", b)
	}
}

// TestMemReservations: a reservation is read once, expires with its TTL,
// and the map holds at most its bound, dropping expired ones first.
func TestMemReservations(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Epoch)
	r := newMemReservations(clock.Now, 3)
	if err := r.put(ctx, "a", []byte("rec-a"), time.Minute); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := r.take(ctx, "a")
	if err != nil || !ok || string(rec) != "rec-a" {
		t.Fatalf("take: %q %v %v", rec, ok, err)
	}
	if _, ok, _ := r.take(ctx, "a"); ok {
		t.Fatal("a reservation was read twice")
	}
	for i := range 3 {
		if err := r.put(ctx, fmt.Sprint(i), nil, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.put(ctx, "over", nil, time.Minute); !errors.Is(err, errTooManyReservations) {
		t.Fatalf("a 4th open reservation of 3: %v", err)
	}
	if err := r.put(ctx, "1", []byte("again"), time.Minute); err != nil {
		t.Fatalf("putting back a kept reservation in a full map: %v", err)
	}
	clock.Advance(time.Minute)
	if _, ok, _ := r.take(ctx, "0"); ok {
		t.Fatal("an expired reservation was read")
	}
	if err := r.put(ctx, "later", nil, time.Minute); err != nil {
		t.Fatalf("expired reservations were not dropped for a new one: %v", err)
	}
}

// TestRedisReservations: on Redis a reservation is a key under the
// deployment's prefix with the reservation's TTL, read once (GETDEL).
func TestRedisReservations(t *testing.T) {
	r := redistest.Standalone(t)
	s, _ := newRedisServer(t, r.Addr, "a", WithConfig(mustParse(t, debtRules+"store:\n  timeout: 2s\n  redis:\n    prefix: resv\n")))
	ctx := context.Background()
	if err := s.resv.put(ctx, "id1", []byte(`{"rule":"r"}`), time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl, err := s.rdb.Do(ctx, s.rdb.B().Pttl().Key("resv:r:id1").Build()).AsInt64(); err != nil || ttl <= 0 || ttl > 60_000 {
		t.Fatalf("the reservation key's TTL: %d %v", ttl, err)
	}
	rec, ok, err := s.resv.take(ctx, "id1")
	if err != nil || !ok || string(rec) != `{"rule":"r"}` {
		t.Fatalf("take: %q %v %v", rec, ok, err)
	}
	if _, ok, err := s.resv.take(ctx, "id1"); ok || err != nil {
		t.Fatalf("a reservation was read twice: %v %v", ok, err)
	}
}

// TestReserveSettleCalls: Server.reserve and Server.settle, which every
// protocol calls (HTTP, RESP), check their own input and settle once.
func TestReserveSettleCalls(t *testing.T) {
	srv, _ := newTestServer(t, WithConfig(mustParse(t, debtRules)))
	ctx := context.Background()
	p := srv.holder.Load()
	if _, _, err := srv.reserve(ctx, p, "tokens", "", "k", 0); !errors.Is(err, weir.ErrInvalidCost) || !strings.Contains(err.Error(), "0") {
		t.Fatalf("reserve 0: %v, want an invalid cost naming 0", err)
	}
	if _, _, err := srv.reserve(ctx, p, "slots", "", "k", 1); !errors.Is(err, weir.ErrUnsupported) {
		t.Fatalf("reserve on a rule without debt: %v", err)
	}
	rr, id, err := srv.reserve(ctx, p, "tokens", "", "k", 40)
	if err != nil || id == "" || rr.Result.Remaining != 60 {
		t.Fatalf("reserve 40: %+v %q %v", rr.Result, id, err)
	}
	if _, _, err := srv.settle(ctx, p, id, -1); !errors.Is(err, weir.ErrInvalidCost) || !strings.Contains(err.Error(), "-1") {
		t.Fatalf("settle at -1: %v, want an invalid cost naming -1", err)
	}
	if _, _, err := srv.settle(ctx, p, strings.Repeat("a", 65), 1); !errors.Is(err, errUnknownReservation) {
		t.Fatalf("settle of a 65-byte id: %v", err)
	}
	rule, rr, err := srv.settle(ctx, p, id, 25)
	if err != nil || rule != "tokens" || rr.Result.Remaining != 75 {
		t.Fatalf("settle 25 of 40: %q %+v %v", rule, rr.Result, err)
	}
	if _, _, err := srv.settle(ctx, p, id, 25); !errors.Is(err, errUnknownReservation) {
		t.Fatalf("a second settle: %v", err)
	}
}
