// Package storefake is a store for tests of what sits in front of a store
// (the guard, policies): a memstore that counts its calls and fails, hangs
// or refuses on demand, and a slog handler that counts messages.
package storefake

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// ErrDown is what a Store answers while Down is set.
var ErrDown = fmt.Errorf("%w: connection refused", weir.ErrStore)

// Store wraps a memstore, counts calls, and fails on demand.
type Store struct {
	// Inner is the memstore that decides when nothing fails.
	Inner *memstore.Store
	// Calls counts the calls that reached the store (validation passed).
	Calls atomic.Int64
	// Down makes calls fail with ErrDown.
	Down atomic.Bool
	// Block makes calls wait for their context to end.
	Block atomic.Bool
	// SawDeadline records whether the last call's context had a deadline.
	SawDeadline atomic.Bool
	// NotSent makes calls fail with weir.ErrNotSent, as a decision that
	// queued past its deadline does.
	NotSent atomic.Bool
	// Validate refuses invalid requests before anything else, as
	// redisstore does before it sends.
	Validate bool
}

// New returns a Store over a memstore reading now (time.Now if nil).
func New(now func() time.Time) *Store {
	var opts []memstore.Option
	if now != nil {
		opts = append(opts, memstore.WithClock(now))
	}
	return &Store{Inner: memstore.New(opts...)}
}

func (f *Store) enter(ctx context.Context) error {
	f.Calls.Add(1)
	_, ok := ctx.Deadline()
	f.SawDeadline.Store(ok)
	if f.NotSent.Load() {
		return fmt.Errorf("%w: waited past its deadline for a connection", weir.ErrNotSent)
	}
	if f.Block.Load() {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", weir.ErrStore, ctx.Err())
	}
	if f.Down.Load() {
		return ErrDown
	}
	return nil
}

// check refuses an invalid request when f.Validate is set.
func (f *Store) check(r *weir.Request) error {
	if !f.Validate || r.Mode == weir.ModeRelease || r.Mode == weir.ModeReset {
		return nil
	}
	return r.Check()
}

// Take implements weir.Store.
func (f *Store) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if err := f.check(&weir.Request{Key: key, Limit: l, N: n}); err != nil {
		return weir.Result{}, err
	}
	if err := f.enter(ctx); err != nil {
		return weir.Result{}, err
	}
	return f.Inner.Take(ctx, key, l, n)
}

// Do implements weir.Store.
func (f *Store) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	for i := range reqs {
		if err := f.check(&reqs[i]); err != nil {
			return err
		}
	}
	if err := f.enter(ctx); err != nil {
		return err
	}
	return f.Inner.Do(ctx, reqs, results)
}

var _ weir.Store = (*Store)(nil)

// LogCounter is a slog.Handler that keeps every record's message, so a
// test can count how often something was logged.
type LogCounter struct {
	mu   sync.Mutex
	msgs []string
}

// Count returns how many records had the message msg.
func (h *LogCounter) Count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// Enabled implements slog.Handler: every level.
func (h *LogCounter) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (h *LogCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.msgs = append(h.msgs, r.Message)
	h.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler.
func (h *LogCounter) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup implements slog.Handler.
func (h *LogCounter) WithGroup(string) slog.Handler { return h }
