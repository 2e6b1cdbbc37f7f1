package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/rueidis"
	"github.com/weir-dev/weir"
)

// reservationKey is where reservation id lives: <prefix>:r:<id>. The id is
// weir's own (weir.NewReservationID, 32 hex digits); a longer one is never
// stored.
func (s *Store) reservationKey(id string) string { return s.prefix + ":r:" + id }

// PutReservation implements weir.ReservationStore: a string with a TTL.
func (s *Store) PutReservation(ctx context.Context, id string, rec []byte, ttl time.Duration) error {
	if !s.conn.connected.Load() {
		return fmt.Errorf("%w: put a reservation: %w", weir.ErrStore, s.notConnectedError())
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	cmd := s.client.B().Set().Key(s.reservationKey(id)).Value(rueidis.BinaryString(rec)).PxMilliseconds(max(ttl.Milliseconds(), 1)).Build()
	if err := s.client.Do(ctx, cmd).Error(); err != nil {
		return fmt.Errorf("%w: put a reservation: %w", weir.ErrStore, err)
	}
	return nil
}

// TakeReservation implements weir.ReservationStore with GETDEL (Redis
// 6.2), so a reservation is read once however many callers race for it.
func (s *Store) TakeReservation(ctx context.Context, id string) ([]byte, bool, error) {
	if !s.conn.connected.Load() {
		return nil, false, fmt.Errorf("%w: take a reservation: %w", weir.ErrStore, s.notConnectedError())
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	v, err := s.client.Do(ctx, s.client.B().Getdel().Key(s.reservationKey(id)).Build()).AsBytes()
	switch {
	case rueidis.IsRedisNil(err):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("%w: take a reservation: %w", weir.ErrStore, err)
	}
	return v, true, nil
}
