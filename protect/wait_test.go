package protect

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCriticalWaits: a critical request that finds the limit full waits
// and gets the next slot freed, before a normal request can take it; a
// normal request never waits; a critical one whose wait ends is shed.
func TestCriticalWaits(t *testing.T) {
	r := mustRule(t, Config{Name: "api", Concurrency: 2, MaxWait: time.Hour})
	a, _ := r.Acquire(Normal)
	b, _ := r.Acquire(Normal)
	type grant struct {
		tk  Ticket
		err error
	}
	got := make(chan grant, 1)
	go func() {
		tk, err := r.Wait(context.Background(), Critical)
		got <- grant{tk, err}
	}()
	// Wait until the critical request is queued.
	for deadline := time.Now().Add(10 * time.Second); ; {
		r.mu.Lock()
		n := len(r.waiters)
		r.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the critical request never queued")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := r.Wait(context.Background(), Normal); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("a normal request at the limit: %v, want shed at once", err)
	}
	a.Done(false) // the slot goes to the waiting critical request
	if _, err := r.Acquire(Normal); err == nil {
		t.Fatal("a normal request took the slot a critical one was waiting for")
	}
	g := <-got
	if g.err != nil {
		t.Fatalf("the waiting critical request: %v", g.err)
	}
	g.tk.Done(false)
	// A wait that ends sheds the request.
	ctx, cancel := context.WithCancel(context.Background())
	c2, err := r.Acquire(Critical)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := r.Wait(ctx, Critical); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("a critical request whose context ended: %v", err)
	}
	b.Done(false)
	c2.Done(false)
	st := r.Stats()
	if st.InFlight != 0 || st.Shed[Critical] != 1 || st.Admitted[Critical] != 2 {
		t.Fatalf("stats %+v", st)
	}
}
