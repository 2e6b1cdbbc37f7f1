package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/storetest"
)

// inFlightNow reports the calls the coalescer has out.
func (q *coalescer) inFlightNow() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.busy
}

// TestCoalesce: with one call in flight at a time, the decisions of 64
// goroutines over every algorithm, two limits each, leave in batches, and
// every key still admits exactly its limit. The clock stands still, so each
// admitted result's Remaining must appear exactly once per key, 0 through
// limit-1, as consecutive calls would report them.
//
// With a linger (Config.Linger), the same with two calls in flight.
func TestCoalesce(t *testing.T) {
	for _, cfg := range []Config{{MaxInFlight: 1, MaxBatch: 16}, {MaxInFlight: 2, MaxBatch: 16, Linger: 2 * time.Millisecond}} {
		t.Run(fmt.Sprintf("in_flight=%d,linger=%v", cfg.MaxInFlight, cfg.Linger), func(t *testing.T) {
			testCoalesce(t, cfg)
		})
	}
}

func testCoalesce(t *testing.T, cfg Config) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Epoch)
	cfg.Addrs, cfg.Clock = []string{srv.Addr}, clock.Now
	s := newTestStore(t, cfg)
	type target struct {
		key string
		l   weir.Limit

		mu        sync.Mutex
		remaining []int64
	}
	var targets []*target
	for _, a := range weir.Algorithms() {
		for k, l := range []weir.Limit{{Rate: 40, Period: time.Hour}, {Rate: 25, Period: 10 * time.Minute}} {
			l.Algorithm = a
			targets = append(targets, &target{key: fmt.Sprintf("%s/%d", a, k), l: l})
		}
	}
	const perKey = 60
	total := int64(len(targets) * perKey)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < total; i = next.Add(1) - 1 {
				tg := targets[i%int64(len(targets))]
				r, err := s.Take(context.Background(), tg.key, tg.l, 1)
				if err != nil {
					errs <- err
					return
				}
				if r.Allowed {
					tg.mu.Lock()
					tg.remaining = append(tg.remaining, r.Remaining)
					tg.mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, tg := range targets {
		slices.Sort(tg.remaining)
		want := make([]int64, tg.l.Rate)
		for i := range want {
			want[i] = int64(i)
		}
		if !slices.Equal(tg.remaining, want) {
			t.Errorf("%s under %v: admitted with Remaining %v; want each of 0..%d once", tg.key, tg.l, tg.remaining, tg.l.Rate-1)
		}
	}
	batches, decisions := s.coalesce.batches.Load(), s.coalesce.decisions.Load()
	if decisions != total || batches >= decisions {
		t.Fatalf("%d decisions in %d calls to Redis; want all %d, coalesced into fewer calls", decisions, batches, total)
	}
	t.Logf("%d decisions in %d calls", decisions, batches)
}

// lingering reports whether a call of q lingers now, and the queue's length.
func (q *coalescer) lingering_() (bool, int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.lingering, len(q.queue)
}

// TestLinger: a call that finds a slot free waits for company and leaves
// as soon as it is a full call; one whose caller leaves while it lingers
// is not sent, and the decisions that joined it are; a lone decision
// leaves when the linger ends. No timing is asserted: the lingers are an
// hour long or counted, not measured.
func TestLinger(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: time.Hour}
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, MaxBatch: 8, Linger: time.Millisecond, Timeout: 2 * time.Hour})
	q := s.coalesce

	// Quiet: a decision that comes more than a linger after the one before
	// never lingers; with a linger of an hour, it would wait that long.
	q.linger = time.Hour
	for i := range 3 {
		q.mu.Lock()
		q.last = time.Now().Add(-2 * time.Hour)
		q.mu.Unlock()
		if r, err := s.Take(ctx, "quiet", l, 1); err != nil || !r.Allowed {
			t.Fatalf("take %d after a quiet spell: %+v %v", i, r, err)
		}
	}
	if n := q.lingers.Load(); n != 0 {
		t.Fatalf("%d calls lingered after quiet spells, want 0", n)
	}

	// Alone: each decision comes less than a linger after the one before
	// (set just before it), lingers, and leaves alone when the linger ends.
	q.linger = 50 * time.Millisecond
	for i := range 5 {
		q.mu.Lock()
		q.last = time.Now()
		q.mu.Unlock()
		if r, err := s.Take(ctx, "alone", l, 1); err != nil || !r.Allowed {
			t.Fatalf("take %d alone: %+v %v", i, r, err)
		}
	}
	if b, d, n := q.batches.Load(), q.decisions.Load(), q.lingers.Load(); b != 8 || d != 8 || n != 5 {
		t.Fatalf("5 decisions one after another: %d decisions in %d calls (%d lingered), want 8 in 8, the 5 lingering", d, b, n)
	}

	// Full: with a linger of an hour, 8 decisions on one key (a full call)
	// leave at once, together; the key admits exactly its 5.
	q.linger = time.Hour
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			r, err := s.Take(ctx, "full", l, 1)
			if err != nil {
				t.Error(err)
			}
			if r.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if b, d := q.batches.Load(), q.decisions.Load(); b != 9 || d != 16 || admitted.Load() != 5 {
		t.Fatalf("8 decisions at once: %d admitted, %d decisions in %d calls so far; want 5 admitted, 16 in 9 (the 8 in one call)", admitted.Load(), d, b)
	}

	// Left: the lingering caller leaves; the 3 decisions that joined it
	// are sent without waiting out the hour, and its own is not.
	lctx, cancel := context.WithCancel(ctx)
	leaderErr := make(chan error, 1)
	go func() {
		_, err := s.Take(lctx, "left", l, 1)
		leaderErr <- err
	}()
	for on, _ := q.lingering_(); !on; on, _ = q.lingering_() {
		time.Sleep(time.Millisecond)
	}
	for range 3 {
		wg.Go(func() {
			if r, err := s.Take(ctx, "left", l, 1); err != nil || !r.Allowed {
				t.Errorf("a decision that joined the lingering call: %+v %v, want admitted", r, err)
			}
		})
	}
	for _, n := q.lingering_(); n < 4; _, n = q.lingering_() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	wg.Wait()
	if err := <-leaderErr; !errors.Is(err, weir.ErrNotSent) {
		t.Fatalf("the lingering caller that left: %v, want ErrNotSent", err)
	}
	if b, d := q.batches.Load(), q.decisions.Load(); b != 10 || d != 19 {
		t.Fatalf("after the leader left: %d decisions in %d calls, want 19 in 10 (the 3 that joined in one call, the leader's not sent)", d, b)
	}
	q.linger = time.Millisecond
	r, err := s.Take(ctx, "left", l, 0)
	if err != nil || r.Remaining != 2 {
		t.Fatalf("key left: %+v %v, want 2 remaining (3 taken)", r, err)
	}
}

// TestCoalesceFailureIsolated: a decision that fails inside a batch (its
// state key holds a list) fails alone, with Redis's error; the decisions
// batched with it stand, and their keys admit exactly their limit.
func TestCoalesceFailureIsolated(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, MaxInFlight: 1})
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 30, Period: time.Hour}
	if _, err := srv.Do("RPUSH", s.names("bad", "fixed_window").state, "x"); err != nil {
		t.Fatal(err)
	}
	var badErrs, badOK atomic.Int64
	var admitted [3]atomic.Int64
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	const total = 400
	for range 48 {
		wg.Go(func() {
			for i := next.Add(1); i <= total; i = next.Add(1) {
				if i%4 == 0 {
					_, err := s.Take(context.Background(), "bad", l, 1)
					if err != nil && errors.Is(err, weir.ErrStore) && strings.Contains(err.Error(), "WRONGTYPE") {
						badErrs.Add(1)
					} else {
						badOK.Add(1)
					}
					continue
				}
				k := i % 3
				r, err := s.Take(context.Background(), fmt.Sprint("good", k), l, 1)
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				if r.Allowed {
					admitted[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		t.Fatalf("a good key failed beside the bad one: %v", e)
	}
	if badErrs.Load() != total/4 || badOK.Load() != 0 {
		t.Fatalf("bad key: %d WRONGTYPE errors wrapping ErrStore and %d other outcomes; want %d and 0", badErrs.Load(), badOK.Load(), total/4)
	}
	for k := range admitted {
		if got := admitted[k].Load(); got != l.Rate {
			t.Errorf("good%d: %d admitted, want %d", k, got, l.Rate)
		}
	}
	if b, d := s.coalesce.batches.Load(), s.coalesce.decisions.Load(); b >= d {
		t.Fatalf("%d decisions in %d calls: nothing was batched", d, b)
	}
}

// TestCoalesceDeadlines: while Redis holds the call in flight (CLIENT
// PAUSE of writes), callers queued behind it leave when their context ends,
// and a decision that left the queue is never sent: once Redis resumes,
// only the calls that were out have counted. Callers without a deadline of
// their own end by the store's timeout. A decision never sent wraps
// weir.ErrNotSent; one sent does not. Redis stays paused until every caller
// has returned (CLIENT UNPAUSE ends it), so a slow machine cannot let a call
// through before its deadline.
func TestCoalesceDeadlines(t *testing.T) {
	srv := redistest.Standalone(t)
	const timeout = 2 * time.Second
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Timeout: timeout, MaxInFlight: 1})
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1000, Period: time.Hour}
	ctx := context.Background()
	if r, err := s.Take(ctx, "k", l, 1); err != nil || !r.Allowed {
		t.Fatalf("first take: %+v %v", r, err)
	}
	// WRITE, not ALL: the decisions wait, CLIENT UNPAUSE does not.
	if _, err := srv.Do("CLIENT", "PAUSE", "600000", "WRITE"); err != nil {
		t.Fatal(err)
	}
	unpaused := false
	unpause := func() {
		if !unpaused {
			unpaused = true
			if _, err := srv.Do("CLIENT", "UNPAUSE"); err != nil {
				t.Error(err)
			}
		}
	}
	defer unpause()

	outErr := make(chan error, 1)
	go func() {
		_, err := s.Take(ctx, "k", l, 1)
		outErr <- err
	}()
	for s.coalesce.inFlightNow() != 1 {
		time.Sleep(time.Millisecond)
	}
	// Callers with a short deadline of their own, and callers with none.
	var wg sync.WaitGroup
	var notSent, sentAnyway, wrong atomic.Int64
	var firstWrong atomic.Value
	for i := range 30 {
		wg.Go(func() {
			cctx := ctx
			if i < 20 {
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
				defer cancel()
			}
			_, err := s.Take(cctx, "k", l, 1)
			switch {
			case err == nil || !errors.Is(err, weir.ErrStore) || !errors.Is(err, context.DeadlineExceeded):
				wrong.Add(1)
				firstWrong.CompareAndSwap(nil, fmt.Sprint(err))
			case strings.Contains(err.Error(), "not sent") != errors.Is(err, weir.ErrNotSent):
				// Never sent must be weir.ErrNotSent, which breakers and
				// store-error metrics do not count; sent must not be.
				wrong.Add(1)
				firstWrong.CompareAndSwap(nil, fmt.Sprintf("%v (ErrNotSent: %v)", err, errors.Is(err, weir.ErrNotSent)))
			case errors.Is(err, weir.ErrNotSent):
				notSent.Add(1)
			case i < 20:
				wrong.Add(1) // a 50ms caller cannot have been sent behind a 2s call
				firstWrong.CompareAndSwap(nil, fmt.Sprint(err))
			default:
				sentAnyway.Add(1)
			}
		})
	}
	wg.Wait()
	if err := <-outErr; err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the call in flight during the pause: %v, want a timeout", err)
	}
	if wrong.Load() != 0 {
		t.Fatalf("%d callers got an unexpected outcome, first: %v", wrong.Load(), firstWrong.Load())
	}
	if notSent.Load() < 20 {
		t.Fatalf("%d callers reported their decision not sent, want at least the 20 with a 50ms deadline", notSent.Load())
	}
	unpause()
	r, err := s.Take(ctx, "k", l, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Counted: the first take, the call in flight, and at most those
	// queued callers whose error says their decision may have been made
	// (Redis runs them on resuming, ahead of this call on the connection).
	if used := l.Rate - r.Remaining; used < 1 || used > 2+sentAnyway.Load() {
		t.Fatalf("%d counted after the pause; want at most %d: decisions that were never sent must not count", used, 2+sentAnyway.Load())
	}
}

// TestBatchOnReplica: a batch script that runs on a replica (EVAL form; a
// demoted primary that the store still talks to) answers READONLY for the
// whole batch, which changed nothing, so the store retries it until the
// deadline instead of failing each decision on the first try. The timeout
// is not what is under test: it leaves a loaded machine ample time for
// Redis to refuse (EVALSHA, then EVAL) and the store to retry; a retry in
// flight when the deadline comes still names the READONLY it retried.
func TestBatchOnReplica(t *testing.T) {
	primary := redistest.Standalone(t)
	replica := redistest.Standalone(t)
	host, port, _ := strings.Cut(primary.Addr, ":")
	if _, err := replica.Do("REPLICAOF", host, port); err != nil {
		t.Fatal(err)
	}
	s := newTestStore(t, Config{Addrs: []string{replica.Addr}, evalOnly: true, MaxInFlight: 1, Timeout: 2 * time.Second})
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Minute}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { _, errs[i] = s.Take(context.Background(), fmt.Sprint("k", i), l, 1) })
	}
	wg.Wait()
	readonly := 0
	for i, err := range errs {
		// Sent: retried on READONLY until the deadline. Still queued when
		// that came: not sent.
		if err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("take %d on a replica: %v; want the deadline", i, err)
		}
		if strings.Contains(err.Error(), "READONLY") {
			if errors.Is(err, weir.ErrNotSent) {
				t.Fatalf("take %d on a replica: %v; sent, yet weir.ErrNotSent", i, err)
			}
			readonly++
		} else if strings.Contains(err.Error(), "not sent") != errors.Is(err, weir.ErrNotSent) {
			// Not sent, or (on a machine too loaded for Redis to answer
			// within the deadline) in flight when it came: either way
			// the error must say which.
			t.Fatalf("take %d on a replica: %v; a \"not sent\" error must be weir.ErrNotSent and no other", i, err)
		}
	}
	if readonly == 0 || s.notRunRetries.Load() == 0 {
		t.Fatalf("%d errors after READONLY, %d retries: READONLY batches were not retried", readonly, s.notRunRetries.Load())
	}
	if keys, _ := keyspace(t, replica); keys != 0 {
		t.Fatalf("%d keys on the replica", keys)
	}
}

// TestFastTakeOneCommandOnAbsentState: a plain take of a fixed window or
// GCRA whose state is absent is one command (SET NX GET writes the state
// it reads as absent); on a present state it is that command and the
// write, and each decision is what GET then SET would have made it.
func TestFastTakeOneCommandOnAbsentState(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Timeout: 10 * time.Second})
	ctx := context.Background()
	for _, algo := range []weir.Algorithm{weir.FixedWindow, weir.GCRA} {
		t.Run(string(algo), func(t *testing.T) {
			l := weir.Limit{Algorithm: algo, Rate: 3, Period: 24 * time.Hour}
			for round := 1; round <= 4; round++ {
				if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 10; i++ {
					r, err := s.Take(ctx, string(algo)+":k"+strconv.Itoa(i), l, 1)
					if err != nil || r.Allowed != (round <= 3) || r.Remaining != int64(max(3-round, 0)) {
						t.Fatalf("round %d, key %d: %+v %v", round, i, r, err)
					}
				}
				calls := commandCalls(t, srv)
				want := 20 // SET NX GET found the state, then the write
				switch round {
				case 1:
					want = 10 // absent: the one command wrote it
				case 4:
					want = 10 // refused: nothing written
				}
				if calls["get"] != 0 || calls["set"] != want {
					t.Errorf("round %d: GET %d times, SET %d, want 0 and %d: %v", round, calls["get"], calls["set"], want, calls)
				}
			}
		})
	}
}
