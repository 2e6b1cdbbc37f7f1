package memstore

import (
	"context"
	"sync"
	"time"

	"github.com/weir-dev/weir"
)

// DefaultMaxReservations bounds the open reservations a Store holds.
const DefaultMaxReservations = 1 << 16

// reservations are weir serve's open reservations (weir.ReservationStore).
type reservations struct {
	mu  sync.Mutex
	m   map[string]reservation
	max int
}

type reservation struct {
	rec     []byte
	expires int64 // µs
}

// PutReservation implements weir.ReservationStore. A full store first
// drops expired reservations; if none expired it refuses the new one
// (weir.ErrTooManyReservations) rather than forget an open one.
func (s *Store) PutReservation(ctx context.Context, id string, rec []byte, ttl time.Duration) error {
	r := &s.resv
	now := s.micros()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]reservation{}
	}
	limit := r.max
	if limit == 0 {
		limit = DefaultMaxReservations
	}
	if len(r.m) >= limit {
		for k, v := range r.m {
			if v.expires <= now {
				delete(r.m, k)
			}
		}
		if len(r.m) >= limit {
			return weir.ErrTooManyReservations
		}
	}
	r.m[id] = reservation{rec: append([]byte(nil), rec...), expires: now + ttl.Microseconds()}
	return nil
}

// TakeReservation implements weir.ReservationStore.
func (s *Store) TakeReservation(ctx context.Context, id string) ([]byte, bool, error) {
	r := &s.resv
	now := s.micros()
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[id]
	if !ok {
		return nil, false, nil
	}
	delete(r.m, id)
	if v.expires <= now {
		return nil, false, nil
	}
	return v.rec, true, nil
}

// WithMaxReservations bounds the open reservations held
// (DefaultMaxReservations by default).
func WithMaxReservations(n int) Option { return func(s *Store) { s.resv.max = max(n, 1) } }
