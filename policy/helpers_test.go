package policy

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// newClock returns a stepped clock at storetest.Epoch.
func newClock() *storetest.Clock { return storetest.NewClock(storetest.Epoch) }

// fakeStore wraps a memstore, counts calls, and fails on demand.
type fakeStore struct {
	inner *memstore.Store
	calls atomic.Int64
	down  atomic.Bool
	// block, when set, makes calls wait for the context to end.
	block atomic.Bool
	// sawDeadline records whether the last call's context had a deadline.
	sawDeadline atomic.Bool
}

func newFakeStore(clock *storetest.Clock) *fakeStore {
	var opts []memstore.Option
	if clock != nil {
		opts = append(opts, memstore.WithClock(clock.Now))
	}
	return &fakeStore{inner: memstore.New(opts...)}
}

var errDown = fmt.Errorf("%w: connection refused", weir.ErrStore)

func (f *fakeStore) enter(ctx context.Context) error {
	f.calls.Add(1)
	_, ok := ctx.Deadline()
	f.sawDeadline.Store(ok)
	if f.block.Load() {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", weir.ErrStore, ctx.Err())
	}
	if f.down.Load() {
		return errDown
	}
	return nil
}

func (f *fakeStore) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if err := f.enter(ctx); err != nil {
		return weir.Result{}, err
	}
	return f.inner.Take(ctx, key, l, n)
}

func (f *fakeStore) Reset(ctx context.Context, key string, l weir.Limit) error {
	if err := f.enter(ctx); err != nil {
		return err
	}
	return f.inner.Reset(ctx, key, l)
}

func (f *fakeStore) TakeAll(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if err := f.enter(ctx); err != nil {
		return err
	}
	return f.inner.TakeAll(ctx, reqs, results)
}

func (f *fakeStore) Release(ctx context.Context, key string, l weir.Limit, lease string) error {
	if err := f.enter(ctx); err != nil {
		return err
	}
	return f.inner.Release(ctx, key, l, lease)
}

// singleStore hides TakeAll: a plain weir.Store.
type singleStore struct{ weir.Store }

// mustPolicy parses doc and builds a Policy over store.
func mustPolicy(t testing.TB, doc string, store weir.Store, opts ...Option) *Policy {
	t.Helper()
	cfg, err := Parse([]byte(doc), t.Name()+".yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// req builds a request from 192.0.2.1 with header pairs.
func req(method, target string, headers ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = "192.0.2.1:4321"
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func from(r *http.Request, addr string) *http.Request {
	r.RemoteAddr = addr
	return r
}

// names lists the rules in a verdict's results.
func names(v Verdict) []string {
	var out []string
	for _, r := range v.Results {
		out = append(out, r.Rule)
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// countingHandler counts slog records whose message is msg.
type countingHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *countingHandler) count(msg string) int {
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

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.msgs = append(h.msgs, r.Message)
	h.mu.Unlock()
	return nil
}

func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
