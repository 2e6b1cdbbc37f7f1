package redisstore

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
)

// TestSentinelFailover: after SENTINEL FAILOVER the store follows the new
// master by itself, and decisions continue (written to the new master)
// within a few seconds.
func TestSentinelFailover(t *testing.T) {
	g := redistest.Sentinel(t)
	s := newTestStore(t, Config{Addrs: g.SentinelAddrs, MasterName: g.MasterName, Timeout: 500 * time.Millisecond})
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.GCRA, Rate: 100, Period: time.Minute}
	if _, err := s.Take(ctx, "before", l, 1); err != nil {
		t.Fatal(err)
	}
	old, err := g.MasterAddr()
	if err != nil {
		t.Fatal(err)
	}
	// Keep deciding throughout, to see the outage from a client's side.
	var calls, failures atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			calls.Add(1)
			if _, err := s.Take(ctx, "background", l, 0); err != nil {
				failures.Add(1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	if err := g.Failover(); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	addr, err := g.MasterAddr()
	if err != nil || addr == old {
		t.Fatalf("master after failover: %s %v (was %s)", addr, err, old)
	}
	master := g.Primary
	if addr == g.Replica.Addr {
		master = g.Replica
	}
	// Poll until a decision succeeds and its state is on the new master.
	for i := 0; ; i++ {
		if time.Since(promoted) > 10*time.Second {
			t.Fatalf("no decision reached the new master %s within 10s of the failover", addr)
		}
		key := "after-" + strconv.Itoa(i)
		if _, err := s.Take(ctx, key, l, 1); err == nil {
			if v, err := master.Do("EXISTS", s.names(key, "gcra").state); err == nil && v == int64(1) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("decisions on the new master %.1fs after it was promoted; during the failover %d of %d background calls failed",
		time.Since(promoted).Seconds(), failures.Load(), calls.Load())
}

// TestTTLAudit runs 100k distinct keys of every algorithm (single takes
// from many goroutines, and batches) with a 1s period and penalty boxes,
// and audits their TTLs three ways:
//
//   - while they are written, INFO keyspace is sampled over and over: the
//     number of keys must always equal the number with an expiry (every
//     script writes a key and its TTL atomically);
//   - when the writers finish, SCAN lists every key still there and PTTL
//     must not be -1 for any;
//   - then every key must go away by itself. A key without a TTL would
//     stay forever, so DBSIZE reaching 0 proves that no key written during
//     the run lacked one, whenever it was written. By then used_memory is
//     back near its baseline.
func TestTTLAudit(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "audit", Timeout: 30 * time.Second})
	ctx := context.Background()
	algos := weir.Algorithms()
	limitOf := func(i int) weir.Limit {
		l := weir.Limit{Algorithm: algos[i%len(algos)], Rate: 2, Period: time.Second}
		if i%5 == 0 {
			l.Block = time.Second
		}
		if l.Algorithm == weir.LeakyBucket && i%3 == 0 {
			l.MaxDelay = 500 * time.Millisecond
		}
		return l
	}
	// Warm up every script, then take the baseline on an empty database.
	for i := range algos {
		if _, err := s.Take(ctx, "warm", limitOf(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Do(ctx, []weir.Request{{Key: "w1", Limit: limitOf(0), N: 1}, {Key: "w2", Limit: limitOf(1), N: 1}}, make([]weir.Result, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("FLUSHALL", "SYNC"); err != nil {
		t.Fatal(err)
	}
	baseline := usedMemory(t, srv)

	// The sampler: keys == expires in every INFO keyspace snapshot.
	samplerDone := make(chan struct{})
	stopSampler := make(chan struct{})
	var samples, maxKeys int64
	go func() {
		defer close(samplerDone)
		for {
			select {
			case <-stopSampler:
				return
			case <-time.After(5 * time.Millisecond):
			}
			keys, expires := keyspace(t, srv)
			if keys != expires {
				t.Errorf("INFO keyspace: %d keys, only %d with an expiry", keys, expires)
				return
			}
			samples++
			maxKeys = max(maxKeys, keys)
		}
	}()

	const keys, singles, batch = 100_000, 20_000, 20
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]weir.Request, batch)
			res := make([]weir.Result, batch)
			for {
				i := int(next.Add(1)) - 1
				var err error
				switch {
				case i < singles:
					k := "single-" + strconv.Itoa(i)
					l := limitOf(i)
					takes := 1
					if l.Block > 0 {
						takes = 3 // admitted, admitted, rejected: a penalty box
					}
					for range takes {
						if _, err = s.Take(ctx, k, l, 1); err != nil {
							break
						}
					}
				case i < singles+(keys-singles)/batch:
					for j := range reqs {
						n := singles + (i-singles)*batch + j
						reqs[j] = weir.Request{Key: "batch-" + strconv.Itoa(n), Limit: limitOf(n), N: 1}
						if j%2 == 0 {
							reqs[j].Mode = weir.ModeAtMost
						}
					}
					err = s.Do(ctx, reqs, res)
				default:
					return
				}
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stopSampler)
	<-samplerDone
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}

	// SCAN what is left and PTTL it in pipelines.
	var names []string
	cursor := "0"
	for {
		v, err := srv.Do("SCAN", cursor, "COUNT", "5000")
		if err != nil {
			t.Fatal(err)
		}
		page := v.([]any)
		cursor = page[0].(string)
		for _, k := range page[1].([]any) {
			names = append(names, k.(string))
		}
		if cursor == "0" {
			break
		}
	}
	for i := 0; i < len(names); i += 1000 {
		chunk := names[i:min(i+1000, len(names))]
		cmds := make([]rueidis.Completed, len(chunk))
		for j, k := range chunk {
			cmds[j] = s.client.B().Pttl().Key(k).Build()
		}
		for j, r := range s.client.DoMulti(ctx, cmds...) {
			if v, err := r.AsInt64(); err != nil || v == -1 {
				t.Fatalf("key %q: PTTL %d %v", chunk[j], v, err)
			}
		}
	}
	t.Logf("%d INFO samples (up to %d live keys) all with keys == expires; %d keys left at the end, none without a TTL", samples, maxKeys, len(names))

	// Once the 1s windows and boxes have passed, Redis expires everything
	// and the memory returns.
	const slack = 1 << 20
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, _ := srv.Do("DBSIZE")
		mem := usedMemory(t, srv)
		if n == int64(0) && mem <= baseline+slack {
			t.Logf("all keys expired by themselves; used_memory %d, baseline %d", mem, baseline)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s on: %v keys left, used_memory %d, baseline %d", n, mem, baseline)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// keyspace returns db0's key count and how many have an expiry.
func keyspace(t *testing.T, srv *redistest.Server) (keys, expires int64) {
	v, err := srv.Do("INFO", "keyspace")
	if err != nil {
		t.Error(err)
		return 0, 0
	}
	for _, line := range strings.Split(v.(string), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "db0:")
		if !ok {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			name, val, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(val, 10, 64)
			switch name {
			case "keys":
				keys = n
			case "expires":
				expires = n
			}
		}
	}
	return keys, expires
}

func usedMemory(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	v, err := srv.Do("INFO", "memory")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(v.(string), "\n") {
		if rest, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("INFO memory without used_memory")
	return 0
}

// TestRedisDown: with Redis hung, a call fails at its deadline; with Redis
// killed, every call fails with an error wrapping weir.ErrStore and naming
// the key; when Redis is back, the same Store recovers by itself. Redis
// hangs (CLIENT PAUSE of writes) until the test ends it, so a call that
// comes back while it still hangs gave up at its deadline: no clock is
// read for that. The bounds on the calls to a killed Redis only catch a
// hang: ten times the timeout.
func TestRedisDown(t *testing.T) {
	srv := redistest.Standalone(t)
	const timeout = time.Second
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Timeout: timeout})
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.SlidingWindow, Rate: 5, Period: time.Minute}
	if _, err := s.Take(ctx, "alice", l, 1); err != nil {
		t.Fatal(err)
	}

	// A hung Redis: it answers no decision until unpaused. The call gives
	// up at its deadline instead of waiting for it.
	if _, err := srv.Do("CLIENT", "PAUSE", "600000", "WRITE"); err != nil {
		t.Fatal(err)
	}
	_, err := s.Take(ctx, "alice", l, 1)
	if !errors.Is(err, weir.ErrStore) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Take against a hung Redis: %v, want a deadline error wrapping ErrStore", err)
	}
	if _, err := srv.Do("CLIENT", "UNPAUSE"); err != nil {
		t.Fatal(err)
	}

	const hang = 10 * timeout
	srv.Kill()
	for i := range 5 {
		start := time.Now()
		_, err := s.Take(ctx, "alice", l, 1)
		took := time.Since(start)
		if !errors.Is(err, weir.ErrStore) || !strings.Contains(err.Error(), keyRef("alice")) {
			t.Fatalf("Take %d with Redis down: %v, want an error wrapping ErrStore that names the key by its hash", i, err)
		}
		if took > hang {
			t.Fatalf("Take %d with Redis down took %v: it hung", i, took)
		}
		if i == 0 {
			t.Logf("with Redis down: %v (after %v)", err, took.Round(time.Millisecond))
		}
	}
	// The other entry points fail the same way.
	start := time.Now()
	for name, call := range map[string]func() error{
		"TakeAll": func() error {
			return s.Do(ctx, []weir.Request{{Key: "a", Limit: l, N: 1}, {Key: "b", Limit: l, N: 1}}, make([]weir.Result, 2))
		},
		"Reset": func() error { return weir.NewLimiter(s).Reset(ctx, "alice", l) },
		"Release": func() error {
			return s.Do(ctx, []weir.Request{{Key: "alice", Limit: weir.Limit{Algorithm: weir.Concurrency, Rate: 1, Period: time.Second}, Mode: weir.ModeRelease, Lease: "lease"}}, make([]weir.Result, 1))
		},
	} {
		if err := call(); !errors.Is(err, weir.ErrStore) {
			t.Fatalf("%s with Redis down: %v", name, err)
		}
	}
	if took := time.Since(start); took > 3*hang {
		t.Fatalf("three calls with Redis down took %v: they hung", took)
	}
	// A new Store cannot connect either, and says so within its context.
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = New(cctx, Config{Addrs: []string{srv.Addr}})
	cancel()
	if !errors.Is(err, weir.ErrStore) || !strings.Contains(err.Error(), srv.Addr) {
		t.Fatalf("New with Redis down: %v", err)
	}

	srv.Start()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		r, err := s.Take(ctx, "bob", l, 1)
		if err == nil {
			if !r.Allowed || r.Remaining != 4 {
				t.Fatalf("after the restart: %+v", r)
			}
			t.Logf("recovered after %d failed calls", i)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery within 30s of the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lateContext is a context whose deadline has passed but whose timer has
// not yet marked it done: the moment in which a dial or read cut short by
// the socket's own deadline returns.
type lateContext struct{ context.Context }

func (lateContext) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }
func (lateContext) Err() error                  { return nil }

// TestRetryableLateDeadline: a network error that came because the
// deadline passed reads as a timeout even before the context says so (CI
// once saw "dial tcp: i/o timeout" without context.DeadlineExceeded).
func TestRetryableLateDeadline(t *testing.T) {
	s := &Store{}
	netErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("i/o timeout")}
	err := s.retryable(lateContext{context.Background()}, netErr, &retries{backoff: time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, netErr) {
		t.Fatalf("retryable = %v, want the network error wrapped with context.DeadlineExceeded", err)
	}
	// Before the deadline the error is given back as it is.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := s.retryable(ctx, netErr, &retries{backoff: time.Millisecond}); err != netErr {
		t.Fatalf("retryable before the deadline = %v, want %v", err, netErr)
	}
}

// TestRetryableNamesRefusal: a call refused with READONLY (which ran
// nothing) is retried; when the deadline then cuts the retry short in
// flight, the error still names the refusal it was retrying after, and
// reads as the timeout it is.
func TestRetryableNamesRefusal(t *testing.T) {
	primary := redistest.Standalone(t)
	replica := redistest.Standalone(t)
	host, port, _ := strings.Cut(primary.Addr, ":")
	if _, err := replica.Do("REPLICAOF", host, port); err != nil {
		t.Fatal(err)
	}
	s := newTestStore(t, Config{Addrs: []string{replica.Addr}})
	ctx := context.Background()
	// While the replica loads the primary's data it answers LOADING.
	var refusal error
	eventually(t, 30*time.Second, "READONLY from the replica", func() bool {
		refusal = s.client.Do(ctx, s.client.B().Set().Key("k").Value("v").Build()).Error()
		return refusal != nil && strings.HasPrefix(refusal.Error(), "READONLY")
	})
	rs := retries{backoff: time.Millisecond}
	if err := s.retryable(ctx, refusal, &rs); err != nil {
		t.Fatalf("READONLY with time left: %v, want a retry", err)
	}
	netErr := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o timeout")}
	err := s.retryable(lateContext{ctx}, netErr, &rs)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "READONLY") || errors.Is(err, weir.ErrNotSent) {
		t.Fatalf("retry cut short by the deadline: %v; want a timeout naming the READONLY refusal, not ErrNotSent", err)
	}
}
