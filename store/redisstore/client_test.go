package redisstore

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
)

// eventually polls cond until it holds or the (generous) wait is over.
func eventually(t *testing.T, wait time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, wait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLazyConnect: with Lazy, New returns a store while nothing listens at
// the address; its calls fail at once with weir.ErrStore; once Redis starts,
// the store connects and sets up by itself (library included), and
// decisions reach Redis, without a new store. Without Lazy, New still
// fails.
func TestLazyConnect(t *testing.T) {
	srv := redistest.Standalone(t)
	srv.Stop()
	if _, err := New(context.Background(), Config{Addrs: []string{srv.Addr}}); !errors.Is(err, weir.ErrStore) {
		t.Fatalf("New without Lazy on a stopped Redis: %v; want an error wrapping weir.ErrStore", err)
	}
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Lazy: true, Timeout: time.Second})
	if s.Connected() {
		t.Fatal("connected to a stopped Redis")
	}
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Minute}
	_, err := s.Take(context.Background(), "k", l, 1)
	if !errors.Is(err, weir.ErrStore) || !strings.Contains(err.Error(), "no connection to Redis at "+srv.Addr) {
		t.Fatalf("take before connecting: %v; want weir.ErrStore naming the address", err)
	}
	if err := s.Do(context.Background(), []weir.Request{{Key: "a", Limit: l, N: 1}, {Key: "b", Limit: l, N: 1}}, make([]weir.Result, 2)); !errors.Is(err, weir.ErrStore) {
		t.Fatalf("TakeAll before connecting: %v", err)
	}
	if err := weir.NewLimiter(s).Reset(context.Background(), "k", l); !errors.Is(err, weir.ErrStore) {
		t.Fatalf("Reset before connecting: %v", err)
	}
	if err := s.Client().Do(context.Background(), s.Client().B().Ping().Build()).Error(); err == nil {
		t.Fatal("the client answered before connecting")
	}

	srv.Start()
	eventually(t, 20*time.Second, "the store to connect", s.Connected)
	r, err := s.Take(context.Background(), "k", l, 1)
	if err != nil || !r.Allowed || r.Remaining != 9 {
		t.Fatalf("take after Redis started: %+v, %v", r, err)
	}
	if s.Scripting() != "functions" || s.libLoads.Load() != 1 {
		t.Fatalf("scripting %s, %d library loads; want functions, 1", s.Scripting(), s.libLoads.Load())
	}
	if n, err := srv.Do("EXISTS", s.names("k", "token_bucket").state); err != nil || n != int64(1) {
		t.Fatalf("state key in Redis: %v, %v", n, err)
	}
	if err := s.Client().Do(context.Background(), s.Client().B().Ping().Build()).Error(); err != nil {
		t.Fatalf("the shared client after connecting: %v", err)
	}
}

// TestReadOnlyReconnect: a standalone store behind a name (played by the
// test's dialer) whose primary is demoted, the name moving to the new
// primary, as ElastiCache and Azure do. The store keeps getting READONLY
// on its old connection, dials the name again, reaches the new primary,
// and decides again, without a restart; reconnects are bounded, one per
// interval.
func TestReadOnlyReconnect(t *testing.T) {
	a := redistest.Standalone(t)
	b := redistest.Standalone(t)
	// b starts as a's replica, as a standby does.
	host, port, _ := strings.Cut(a.Addr, ":")
	if _, err := b.Do("REPLICAOF", host, port); err != nil {
		t.Fatal(err)
	}
	// The name resolves to target; each client the store makes resolves
	// it once, when it first dials, and keeps that address for its
	// connections: a redial by rueidis itself (after a deadline in flight,
	// say) returns to the same server, so only a new client, the store's
	// reconnect, can reach the new primary.
	var target atomic.Pointer[string]
	target.Store(&a.Addr)
	var mu sync.Mutex
	resolved := map[int64]string{}
	dial := func(ctx context.Context, _ string, client int64) (net.Conn, error) {
		mu.Lock()
		addr, ok := resolved[client]
		if !ok {
			addr = *target.Load()
			resolved[client] = addr
		}
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	s := newTestStore(t, Config{Addrs: []string{"redis.example:6379"}, dial: dial, Timeout: 200 * time.Millisecond})
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1000, Period: time.Hour}
	if _, err := s.Take(context.Background(), "k", l, 1); err != nil {
		t.Fatal(err)
	}

	// Failover: from becomes a replica of to. The name still means from
	// (connections dialed now reach it), until a decision has been refused
	// with READONLY; then it moves to the new primary, as a DNS record
	// does after its TTL.
	failover := func(from, to *redistest.Server) {
		t.Helper()
		// The standby has caught up: the library and the state are there.
		eventually(t, 20*time.Second, "the replica to catch up", func() bool {
			fl, err := to.Do("FUNCTION", "LIST")
			n, err2 := to.Do("EXISTS", s.names("k", "fixed_window").state)
			return err == nil && err2 == nil && len(fl.([]any)) > 0 && n == int64(1)
		})
		start, before := time.Now(), s.conn.reconnects.Load()
		if _, err := to.Do("REPLICAOF", "NO", "ONE"); err != nil {
			t.Fatal(err)
		}
		host, port, _ := strings.Cut(to.Addr, ":")
		if _, err := from.Do("REPLICAOF", host, port); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "READONLY from the demoted primary", func() bool {
			_, err := s.Take(context.Background(), "k", l, 1)
			return err != nil && strings.Contains(err.Error(), "READONLY")
		})
		target.Store(&to.Addr)
		eventually(t, 30*time.Second, "decisions on the new primary", func() bool {
			_, err := s.Take(context.Background(), "k", l, 1)
			return err == nil
		})
		// At least one reconnect, and no more than one per interval.
		n := s.conn.reconnects.Load() - before
		if most := 1 + int64(time.Since(start)/readOnlyReconnectEvery); n < 1 || n > most {
			t.Fatalf("%d reconnects; want 1 to %d", n, most)
		}
		if n, err := to.Do("EXISTS", s.names("k", "fixed_window").state); err != nil || n != int64(1) {
			t.Fatalf("state key on the new primary: %v, %v", n, err)
		}
	}
	failover(a, b)
	failover(b, a) // and back
}

// callersClient makes a client as a program would for its own use, and
// closes it when t ends.
func callersClient(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestNewWithClient: a store built on the caller's client decides over it
// (the state lands in that Redis, the library is loaded), lends it back
// through Client, refuses connection settings that the client already
// fixes, and Close stops the store but leaves the caller's client open.
func TestNewWithClient(t *testing.T) {
	srv := redistest.Standalone(t)
	c := callersClient(t, srv.Addr)
	ctx := context.Background()
	for _, cfg := range []Config{
		{Addrs: []string{srv.Addr}}, {MasterName: "m"}, {Password: "pw"}, {DB: 2}, {Lazy: true},
	} {
		if _, err := NewWithClient(ctx, c, cfg); err == nil || !strings.Contains(err.Error(), "Config.") {
			t.Errorf("NewWithClient with %+v: %v; want an error naming the field", cfg, err)
		}
	}
	if _, err := NewWithClient(ctx, c, Config{Prefix: "a{b"}); err == nil || !strings.Contains(err.Error(), `"a{b"`) {
		t.Errorf("NewWithClient with a bad prefix: %v", err)
	}
	if _, err := NewWithClient(ctx, nil, Config{}); err == nil {
		t.Error("NewWithClient with a nil client: no error")
	}

	s, err := NewWithClient(ctx, c, Config{Prefix: "mine", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Connected() || s.Scripting() != "functions" {
		t.Fatalf("connected %v, scripting %s; want true, functions", s.Connected(), s.Scripting())
	}
	l := weir.Limit{Algorithm: weir.GCRA, Rate: 2, Period: time.Minute}
	for i, want := range []bool{true, true, false} {
		r, err := s.Take(ctx, "k", l, 1)
		if err != nil || r.Allowed != want {
			t.Fatalf("take %d: %+v, %v; want allowed %v", i, r, err, want)
		}
	}
	if n, err := srv.Do("EXISTS", s.names("k", "gcra").state); err != nil || n != int64(1) {
		t.Fatalf("state key %s in Redis: %v, %v", s.names("k", "gcra").state, n, err)
	}
	if err := s.Client().Do(ctx, s.Client().B().Ping().Build()).Error(); err != nil {
		t.Fatalf("the store's client: %v", err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Take(ctx, "k", l, 0); !errors.Is(err, weir.ErrStore) {
		t.Fatalf("take after Close: %v; want an error wrapping weir.ErrStore", err)
	}
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
		t.Fatalf("the caller's client after the store closed: %v", err)
	}
	if v, err := c.Do(ctx, c.B().Exists().Key(s.names("k", "gcra").state).Build()).AsInt64(); err != nil || v != 1 {
		t.Fatalf("the caller's client reading the store's key: %v, %v", v, err)
	}
}

// TestDialTimeoutFollowsTimeout: a connection's dial may take the store's
// Timeout when that is longer than 2s (under heavy load a loopback dial
// took more than 2s, and every call waiting for that connection failed
// although its own deadline was 10s away), and 2s otherwise; a connection
// waits for answers the longer of Timeout and 10s before it is dropped.
func TestDialTimeoutFollowsTimeout(t *testing.T) {
	addr := redistest.Standalone(t).Addr
	for _, c := range []struct{ timeout, dial, conn time.Duration }{
		{30 * time.Second, 30 * time.Second, 30 * time.Second},
		{5 * time.Second, 5 * time.Second, 10 * time.Second},
		{50 * time.Millisecond, 2 * time.Second, 10 * time.Second},
		{0, 2 * time.Second, 10 * time.Second},
	} {
		s, err := New(context.Background(), Config{Addrs: []string{addr}, Timeout: c.timeout})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.conn.opt.Dialer.Timeout; got != c.dial {
			t.Errorf("Timeout %v: dial timeout %v, want %v", c.timeout, got, c.dial)
		}
		if got := s.conn.opt.ConnWriteTimeout; got != c.conn {
			t.Errorf("Timeout %v: connection timeout %v, want %v", c.timeout, got, c.conn)
		}
		s.Close()
	}
}
