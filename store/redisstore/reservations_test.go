package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
)

// TestReservations: a reservation is read once (GETDEL), under the
// store's prefix, and expires with its TTL.
func TestReservations(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: fmt.Sprintf("resv%d", prefixSeq.Add(1))})
	ctx := context.Background()
	if err := s.PutReservation(ctx, "id1", []byte(`{"rule":"r"}`), time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl, err := s.client.Do(ctx, s.client.B().Pttl().Key(s.prefix+":r:id1").Build()).AsInt64(); err != nil || ttl <= 0 || ttl > 60_000 {
		t.Fatalf("the reservation key's TTL: %d %v", ttl, err)
	}
	rec, ok, err := s.TakeReservation(ctx, "id1")
	if err != nil || !ok || string(rec) != `{"rule":"r"}` {
		t.Fatalf("take: %q %v %v", rec, ok, err)
	}
	if _, ok, err := s.TakeReservation(ctx, "id1"); ok || err != nil {
		t.Fatalf("a reservation was read twice: %v %v", ok, err)
	}
	if err := s.PutReservation(ctx, "id2", []byte("x"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ok, err := s.TakeReservation(ctx, "id2-probe")
		if err != nil || ok {
			t.Fatalf("an unknown id: %v %v", ok, err)
		}
		n, _ := s.client.Do(ctx, s.client.B().Exists().Key(s.prefix+":r:id2").Build()).AsInt64()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a reservation outlived its TTL")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, ok, _ := s.TakeReservation(ctx, "id2"); ok {
		t.Fatal("an expired reservation was read")
	}
}
