package memstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/storetest"
)

// TestReservations: a reservation is read once, expires with its TTL, and
// the store holds at most its maximum, dropping expired ones first.
func TestReservations(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Epoch)
	s := New(WithClock(clock.Now), WithMaxReservations(3))
	if err := s.PutReservation(ctx, "a", []byte("rec-a"), time.Minute); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := s.TakeReservation(ctx, "a")
	if err != nil || !ok || string(rec) != "rec-a" {
		t.Fatalf("take: %q %v %v", rec, ok, err)
	}
	if _, ok, _ := s.TakeReservation(ctx, "a"); ok {
		t.Fatal("a reservation was read twice")
	}
	for i := range 3 {
		if err := s.PutReservation(ctx, fmt.Sprint(i), nil, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutReservation(ctx, "over", nil, time.Minute); !errors.Is(err, weir.ErrTooManyReservations) {
		t.Fatalf("a 4th open reservation of 3: %v", err)
	}
	clock.Advance(time.Minute)
	if _, ok, _ := s.TakeReservation(ctx, "0"); ok {
		t.Fatal("an expired reservation was read")
	}
	if err := s.PutReservation(ctx, "later", nil, time.Minute); err != nil {
		t.Fatalf("expired reservations were not dropped for a new one: %v", err)
	}
}
