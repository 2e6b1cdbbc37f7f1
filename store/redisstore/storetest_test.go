package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/storetest"
)

// newTestStore connects a Store to addrs and closes it when t ends.
func newTestStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second // generous: the race detector on 2 cores
	}
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var prefixSeq atomic.Int64

// harness builds storetest harnesses over one Redis deployment: each
// subtest gets its own Store, test clock and key prefix.
func harness(addrs []string) func(t *testing.T) storetest.Harness {
	return func(t *testing.T) storetest.Harness {
		clock := storetest.NewClock(storetest.Epoch)
		s := newTestStore(t, Config{
			Addrs:  addrs,
			Clock:  clock.Now,
			Prefix: fmt.Sprintf("st%d", prefixSeq.Add(1)),
		})
		return storetest.Harness{Store: s, Clock: clock, TTL: s.TTL, TTLSlack: time.Millisecond}
	}
}

func TestConformanceStandalone(t *testing.T) {
	srv := redistest.Standalone(t)
	storetest.Run(t, harness([]string{srv.Addr}))
}

// TestConformanceLinger runs the suite on stores whose calls linger
// (Config.Linger) for company.
func TestConformanceLinger(t *testing.T) {
	srv := redistest.Standalone(t)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		clock := storetest.NewClock(storetest.Epoch)
		s := newTestStore(t, Config{
			Addrs:  []string{srv.Addr},
			Clock:  clock.Now,
			Prefix: fmt.Sprintf("lg%d", prefixSeq.Add(1)),
			Linger: 200 * time.Microsecond,
		})
		return storetest.Harness{Store: s, Clock: clock, TTL: s.TTL, TTLSlack: time.Millisecond}
	})
}

// TestConformanceCallersClient runs the suite on stores built by
// NewWithClient over one client of the test's, which every subtest's
// store shares and none closes.
func TestConformanceCallersClient(t *testing.T) {
	srv := redistest.Standalone(t)
	c := callersClient(t, srv.Addr)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		clock := storetest.NewClock(storetest.Epoch)
		s, err := NewWithClient(context.Background(), c, Config{
			Timeout: 5 * time.Second,
			Clock:   clock.Now,
			Prefix:  fmt.Sprintf("cc%d", prefixSeq.Add(1)),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return storetest.Harness{Store: s, Clock: clock, TTL: s.TTL, TTLSlack: time.Millisecond}
	})
}
