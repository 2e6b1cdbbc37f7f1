package storetest_test

// The suite is tested as testing/fstest is: Run is pointed at stores that
// are each broken in exactly one way, and every one of them must fail, in
// the subtest and with the message that names its defect. A correct store
// behind the same harness must pass.
//
// Run takes a *testing.T, and a failing *testing.T fails its parent, so the
// broken stores run in a child process: TestSuiteFailsBrokenStores runs this
// test binary again with brokenEnv set, which makes TestBrokenStoresChild
// run the suite against each store, and reads the child's -test.v output.
// This keeps storetest's API as it is (no recorder interface that store
// authors would see) and checks the suite through the very *testing.T path
// that a store's own test takes: t.Run, Fatal, Errorf and Skip.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// store is what a broken store offers the harness: a Store whose
// expiries the Expiry subtest can read.
type store interface {
	weir.Store
	TTL(key string, l weir.Limit) (time.Duration, bool)
}

// defect is one broken store and where the suite must catch it.
type defect struct {
	name string
	// build wraps a memstore reading clock (build may give the memstore
	// its own view of the clock; that is the defect then).
	build func(clock *storetest.Clock) store
	// fails lists the subtests, relative to the store's run ("gcra/Sequence",
	// "concurrency/Leases"), that must fail, each with a message containing
	// msg. Other subtests may fail too: one defect often shows in several.
	fails []failure
}

type failure struct {
	tests []string
	msg   string
}

// every names subtest test of every algorithm.
func every(test string) []string {
	var names []string
	for _, a := range weir.Algorithms() {
		names = append(names, string(a)+"/"+test)
	}
	return names
}

func mem(clock *storetest.Clock) *memstore.Store {
	return memstore.New(memstore.WithClock(clock.Now))
}

// control is the correct store behind the same harness.
const control = "correct"

var defects = []defect{
	{
		name:  control,
		build: func(c *storetest.Clock) store { return mem(c) },
	},
	{
		name:  "off-by-one",
		build: func(c *storetest.Clock) store { return offByOne{mem(c)} },
		fails: []failure{
			{every("Sequence"), "got allowed=true"},
			{every("Hammer"), "admitted by 48 goroutines, want exactly 100"},
		},
	},
	{
		name:  "consumes-on-rejection",
		build: func(c *storetest.Clock) store { return &chargesRejections{Store: mem(c)} },
		fails: []failure{{every("RejectionConsumesNothing"), "(the rejections consumed?)"}},
	},
	{
		name:  "late-retry-after",
		build: func(c *storetest.Clock) store { return lateRetryAfter{mem(c)} },
		fails: []failure{{every("RetryAfterExact"), "admitted 1µs before RetryAfter"}},
	},
	{
		name:  "early-retry-after",
		build: func(c *storetest.Clock) store { return earlyRetryAfter{mem(c)} },
		fails: []failure{{every("RetryAfterExact"), "1µs before RetryAfter, RetryAfter is"}},
	},
	{
		name:  "late-reset-after",
		build: func(c *storetest.Clock) store { return lateResetAfter{mem(c)} },
		fails: []failure{{every("ResetAfterExact"), "the state is already full"}},
	},
	{
		name:  "millisecond-clock",
		build: func(c *storetest.Clock) store { return millisecondClock(c) },
		fails: []failure{
			{every("RetryAfterExact"), "admitted 1µs before RetryAfter"},
			{every("ResetAfterExact"), "the state is already full"},
		},
	},
	{
		name:  "ignores-block",
		build: func(c *storetest.Clock) store { return ignoresBlock{mem(c)} },
		fails: []failure{{every("PenaltyBox"), "first rejection: got"}},
	},
	{
		name:  "box-expires-with-state",
		build: func(c *storetest.Clock) store { return boxExpiresWithState{mem(c)} },
		fails: []failure{{every("PenaltyBox"), "inside the penalty box: got"}},
	},
	{
		name:  "reset-keeps-box",
		build: func(c *storetest.Clock) store { return &resetKeepsBox{Store: mem(c), clock: c} },
		fails: []failure{{every("PenaltyBox"), "after Reset:"}},
	},
	{
		name:  "peek-starts-box",
		build: func(c *storetest.Clock) store { return peekStartsBox{mem(c)} },
		fails: []failure{{every("PenaltyBox"), "a peek must not start the penalty box"}},
	},
	{
		name:  "peek-consumes",
		build: func(c *storetest.Clock) store { return peekConsumes{mem(c)} },
		fails: []failure{{every("Peek"), "peek on a fresh key"}},
	},
	{
		name:  "non-atomic-batch",
		build: func(c *storetest.Clock) store { return nonAtomicBatch{mem(c)} },
		fails: []failure{{every("Batch"), "rejected batches consumed from the wide limit"}},
	},
	{
		name:  "at-most-all-or-nothing",
		build: func(c *storetest.Clock) store { return atMostAllOrNothing{mem(c)} },
		fails: []failure{{every("AtMost"), "want 1 granted"}},
	},
	{
		name:  "release-ignored",
		build: func(c *storetest.Clock) store { return releaseIgnored{mem(c)} },
		fails: []failure{{[]string{"concurrency/Leases"}, "after releasing a lease of 3"}},
	},
	{
		name:  "bad-cost-rejected",
		build: func(c *storetest.Clock) store { return badCostRejected{mem(c)} },
		fails: []failure{{every("BadInput"), "want ErrInvalidCost"}},
	},
	{
		name:  "key-escape-collision",
		build: func(c *storetest.Clock) store { return keyEscape{mem(c)} },
		fails: []failure{{every("KeyIsolation"), "it shares state with another key"}},
	},
	{
		name:  "expiry-too-long",
		build: func(c *storetest.Clock) store { return expiryTooLong{mem(c)} },
		fails: []failure{{every("Expiry"), "after take: TTL"}},
	},
	{
		name:  "undated-batch",
		build: func(c *storetest.Clock) store { return undatedBatch{mem(c)} },
		fails: []failure{{debtAlgorithms("DebtLateSettleBatch"), "the cost request's stamp"}},
	},
	{
		name:  "no-shaping",
		build: func(c *storetest.Clock) store { return noShaping{mem(c)} },
		fails: []failure{{[]string{"leaky_bucket/Shaping"}, "want delay"}},
	},
}

// offByOne admits one event more than the limit (a > where ≥ belongs): it
// decides against Rate+1 and reports the numbers of the limit it was given.
type offByOne struct{ *memstore.Store }

func (s offByOne) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if err := l.Validate(); err != nil {
		return s.Store.Take(ctx, key, l, n) // bad limits are still refused
	}
	m := l
	m.Rate++
	if m.Burst > 0 {
		m.Burst++
	}
	r, err := s.Store.Take(ctx, key, m, n)
	r.Limit--
	r.Remaining = max(r.Remaining-1, 0)
	return r, err
}

// chargesRejections counts a rejected request against its key, as a
// counter of every request would: the cost is charged from the capacity
// that frees up next.
type chargesRejections struct {
	*memstore.Store
	mu   sync.Mutex
	debt map[string]int64
}

func (s *chargesRejections) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := string(l.Algorithm) + "\x00" + key
	if d := s.debt[k]; d > 0 {
		var res [1]weir.Result
		if err := s.Store.Do(ctx, []weir.Request{{Key: key, Limit: l, N: d, Mode: weir.ModeAtMost}}, res[:]); err == nil {
			s.debt[k] -= res[0].Granted
		}
	}
	r, err := s.Store.Take(ctx, key, l, n)
	if err == nil && !r.Allowed && n > 0 {
		if s.debt == nil {
			s.debt = make(map[string]int64)
		}
		s.debt[k] += n
	}
	return r, err
}

// lateRetryAfter rounds RetryAfter up to whole milliseconds, as a store
// keeping time in milliseconds would.
type lateRetryAfter struct{ *memstore.Store }

func (s lateRetryAfter) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	r, err := s.Store.Take(ctx, key, l, n)
	if r.RetryAfter%time.Millisecond != 0 {
		r.RetryAfter = r.RetryAfter.Truncate(time.Millisecond) + time.Millisecond
	}
	return r, err
}

// earlyRetryAfter truncates RetryAfter to whole milliseconds.
type earlyRetryAfter struct{ *memstore.Store }

func (s earlyRetryAfter) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	r, err := s.Store.Take(ctx, key, l, n)
	r.RetryAfter = r.RetryAfter.Truncate(time.Millisecond)
	return r, err
}

// lateResetAfter rounds ResetAfter up to whole seconds, as a store that
// derives it from a key's expiry in seconds would.
type lateResetAfter struct{ *memstore.Store }

func (s lateResetAfter) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	r, err := s.Store.Take(ctx, key, l, n)
	if r.ResetAfter%time.Second != 0 {
		r.ResetAfter = r.ResetAfter.Truncate(time.Second) + time.Second
	}
	return r, err
}

// millisecondClock is a memstore that reads the clock to the millisecond
// only (as from Redis's TIME rounded, or a Unix-millisecond field).
func millisecondClock(c *storetest.Clock) *memstore.Store {
	return memstore.New(memstore.WithClock(func() time.Time { return c.Now().Truncate(time.Millisecond) }))
}

// ignoresBlock never starts a penalty box.
type ignoresBlock struct{ *memstore.Store }

func (s ignoresBlock) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if l.Block > 0 { // a negative Block is still refused
		l.Block = 0
	}
	return s.Store.Take(ctx, key, l, n)
}

// boxExpiresWithState forgets a penalty box once the limit's own state has
// recovered, as a store would that keeps the box in the state's key and
// lets the key expire at the state's ResetAfter.
type boxExpiresWithState struct{ *memstore.Store }

func (s boxExpiresWithState) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if l.Block > 0 {
		if p, err := s.Store.Take(ctx, key, l, 0); err == nil && !p.BlockedUntil.IsZero() {
			bare := l
			bare.Block = 0
			if q, err := s.Store.Take(ctx, key, bare, 0); err == nil && q.ResetAfter == 0 {
				if err := weir.NewLimiter(s.Store).Reset(ctx, key, l); err != nil {
					return weir.Result{}, err
				}
			}
		}
	}
	return s.Store.Take(ctx, key, l, n)
}

// resetKeepsBox also records every penalty box in a table of its own,
// which Reset forgets to clear.
type resetKeepsBox struct {
	*memstore.Store
	clock *storetest.Clock
	mu    sync.Mutex
	boxes map[string]time.Time
}

func (s *resetKeepsBox) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := string(l.Algorithm) + "\x00" + key
	if until, ok := s.boxes[k]; ok && l.Block > 0 && s.clock.Now().Before(until) {
		p, err := s.Store.Take(ctx, key, l, 0)
		if err != nil {
			return p, err
		}
		if p.BlockedUntil.IsZero() { // the state was Reset; the table was not
			p.Allowed, p.Remaining, p.Granted, p.BlockedUntil = false, 0, 0, until
			p.RetryAfter = max(p.RetryAfter, until.Sub(s.clock.Now()))
			return p, nil
		}
	}
	r, err := s.Store.Take(ctx, key, l, n)
	if !r.BlockedUntil.IsZero() {
		if s.boxes == nil {
			s.boxes = make(map[string]time.Time)
		}
		s.boxes[k] = r.BlockedUntil
	}
	return r, err
}

// peekStartsBox treats a rejected peek as a rejected request.
type peekStartsBox struct{ *memstore.Store }

func (s peekStartsBox) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	r, err := s.Store.Take(ctx, key, l, n)
	if err == nil && n == 0 && !r.Allowed && l.Block > 0 && r.BlockedUntil.IsZero() {
		return s.Store.Take(ctx, key, l, 1)
	}
	return r, err
}

// peekConsumes answers a peek correctly but then takes one event.
type peekConsumes struct{ *memstore.Store }

func (s peekConsumes) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	r, err := s.Store.Take(ctx, key, l, n)
	if err == nil && n == 0 && r.Allowed {
		_, err = s.Store.Take(ctx, key, l, 1)
	}
	return r, err
}

// nonAtomicBatch reports a batch's results as a correct store would, but
// when one request is rejected, the others that would have been admitted
// alone consume anyway (a batch applied request by request).
type nonAtomicBatch struct{ *memstore.Store }

func (s nonAtomicBatch) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if err := s.Store.Do(ctx, reqs, results); err != nil {
		return err
	}
	rejected := false
	for i := range reqs {
		rejected = rejected || !results[i].Allowed
	}
	if !rejected {
		return nil
	}
	for i, r := range reqs {
		if results[i].Allowed && r.N > 0 {
			if _, err := s.Store.Take(ctx, r.Key, r.Limit, r.N); err != nil {
				return err
			}
		}
	}
	return nil
}

// atMostAllOrNothing ignores weir.ModeAtMost: a partial grant is refused.
type atMostAllOrNothing struct{ *memstore.Store }

func (s atMostAllOrNothing) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	all := make([]weir.Request, len(reqs))
	for i, r := range reqs {
		if r.Mode == weir.ModeAtMost {
			r.Mode = weir.ModeTake
		}
		all[i] = r
	}
	return s.Store.Do(ctx, all, results)
}

// releaseIgnored never gives a lease back: leases only expire.
type releaseIgnored struct{ *memstore.Store }

func (s releaseIgnored) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if len(reqs) == 1 && reqs[0].Mode == weir.ModeRelease {
		return nil
	}
	return s.Store.Do(ctx, reqs, results)
}

// badCostRejected answers a cost the limit can never admit with a
// rejection instead of an error.
type badCostRejected struct{ *memstore.Store }

func (s badCostRejected) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	r, err := s.Store.Take(ctx, key, l, n)
	if errors.Is(err, weir.ErrInvalidCost) {
		return weir.Result{Allowed: false, Limit: l.Rate, RetryAfter: l.Period}, nil
	}
	return r, err
}

// keyEscape escapes ':' in keys as "%3A" but not '%' itself, so "a:b" and
// "a%3Ab" share one state.
type keyEscape struct{ *memstore.Store }

func escape(key string) string { return strings.ReplaceAll(key, ":", "%3A") }

func (s keyEscape) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	return s.Store.Take(ctx, escape(key), l, n)
}

func (s keyEscape) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	esc := make([]weir.Request, len(reqs))
	for i, r := range reqs {
		r.Key = escape(r.Key)
		esc[i] = r
	}
	return s.Store.Do(ctx, esc, results)
}

func (s keyEscape) TTL(key string, l weir.Limit) (time.Duration, bool) {
	return s.Store.TTL(escape(key), l)
}

// expiryTooLong keeps every key a period longer than its state matters.
type expiryTooLong struct{ *memstore.Store }

func (s expiryTooLong) TTL(key string, l weir.Limit) (time.Duration, bool) {
	ttl, ok := s.Store.TTL(key, l)
	if ok {
		ttl += l.Period
	}
	return ttl, ok
}

// noShaping polices a shaping leaky bucket: it never asks for a delay.
type noShaping struct{ *memstore.Store }

func (s noShaping) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	r, err := s.Store.Take(ctx, key, l, n)
	r.Delay = 0
	return r, err
}

// brokenEnv makes TestBrokenStoresChild run; it is set only in the child.
const brokenEnv = "WEIR_STORETEST_BROKEN_CHILD"

// TestBrokenStoresChild runs the suite against every store of defects. It
// runs only in the child process that TestSuiteFailsBrokenStores starts,
// and is expected to fail there.
func TestBrokenStoresChild(t *testing.T) {
	if os.Getenv(brokenEnv) != "1" {
		t.Skip("runs in the child process of TestSuiteFailsBrokenStores")
	}
	for _, d := range defects {
		t.Run(d.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				clock := storetest.NewClock(storetest.Epoch)
				s := d.build(clock)
				return storetest.Harness{Store: s, Clock: clock, TTL: s.TTL}
			})
		})
	}
}

// TestSuiteFailsBrokenStores requires the suite to fail each broken store
// where its defect shows, and to pass the correct one.
func TestSuiteFailsBrokenStores(t *testing.T) {
	if os.Getenv(brokenEnv) == "1" {
		t.Skip("this is the child")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenStoresChild$", "-test.v", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), brokenEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the child run ended with %v, want exit status 1 (failed tests); output:\n%s", err, out)
	}
	tests := parseVerbose(out)
	root := "TestBrokenStoresChild/"
	for _, d := range defects {
		t.Run(d.name, func(t *testing.T) {
			prefix := root + d.name + "/"
			run, ok := tests[root+d.name]
			if !ok {
				t.Fatalf("the child never ran %s", root+d.name)
			}
			if d.name == control {
				if run.status != "PASS" {
					t.Fatalf("the correct store did not pass: %s\n%s", run.status, failures(tests, prefix))
				}
				// The harness gives a clock, expiries and a MultiStore, so
				// nothing may be skipped but the subtests that do not
				// apply to an algorithm.
				for name, r := range tests {
					if strings.HasPrefix(name, prefix) && r.status == "SKIP" && !notForEveryAlgorithm(name) {
						t.Errorf("%s skipped for the correct store:\n%s", name, r.out.String())
					}
				}
				return
			}
			if run.status != "FAIL" {
				t.Fatalf("the suite passed a store with defect %q (status %s)", d.name, run.status)
			}
			for _, f := range d.fails {
				for _, name := range f.tests {
					r, ok := tests[prefix+name]
					switch {
					case !ok:
						t.Errorf("%s: subtest %s never ran", d.name, name)
					case r.status != "FAIL":
						t.Errorf("%s: subtest %s ended %s, want FAIL with %q", d.name, name, r.status, f.msg)
					case !strings.Contains(r.out.String(), f.msg):
						t.Errorf("%s: subtest %s failed, but not with %q:\n%s", d.name, name, f.msg, r.out.String())
					}
				}
			}
			if t.Failed() {
				t.Logf("all failures for %s:\n%s", d.name, failures(tests, prefix))
			}
		})
	}
}

// testRun is one test's outcome and output in a -test.v run.
type testRun struct {
	status string // PASS, FAIL or SKIP
	out    strings.Builder
}

// parseVerbose reads the output of a test binary run with -test.v: each
// "=== RUN", "=== NAME" or "=== CONT" line names the test that the output
// after it belongs to, and "--- PASS/FAIL/SKIP: name" gives its outcome.
func parseVerbose(out []byte) map[string]*testRun {
	tests := make(map[string]*testRun)
	get := func(name string) *testRun {
		r := tests[name]
		if r == nil {
			r = &testRun{}
			tests[name] = r
		}
		return r
	}
	var cur *testRun
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if marker, name, ok := strings.Cut(trimmed, " "); ok && (marker == "===" || marker == "---") {
			verb, rest, _ := strings.Cut(strings.TrimSpace(name), " ")
			rest = strings.TrimSpace(rest)
			switch verb {
			case "RUN", "NAME", "CONT":
				cur = get(rest)
				continue
			case "PASS:", "FAIL:", "SKIP:":
				name, _, _ := strings.Cut(rest, " (")
				r := get(name)
				r.status = strings.TrimSuffix(verb, ":")
				cur = r // a skip's reason follows its "--- SKIP" line
				continue
			}
		}
		if cur != nil {
			cur.out.WriteString(line)
			cur.out.WriteByte('\n')
		}
	}
	return tests
}

// failures lists the failed tests under prefix with their output.
func failures(tests map[string]*testRun, prefix string) string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(tests)) {
		if r := tests[name]; strings.HasPrefix(name, prefix) && r.status == "FAIL" && r.out.Len() > 0 {
			fmt.Fprintf(&b, "%s:\n%s", name, r.out.String())
		}
	}
	return b.String()
}

// notForEveryAlgorithm reports whether the subtest name is one that skips
// the algorithms it does not apply to.
func notForEveryAlgorithm(name string) bool {
	return strings.HasSuffix(name, "/SameAsTokenBucket") || strings.HasSuffix(name, "/LoweredBurst") || strings.HasSuffix(name, "/DebtLoweredLimit")
}

// debtAlgorithms names subtest test of every algorithm with debt.
func debtAlgorithms(test string) []string {
	var names []string
	for _, a := range weir.Algorithms() {
		if a != weir.Concurrency {
			names = append(names, string(a)+"/"+test)
		}
	}
	return names
}

// undatedBatch dates no batch (Result.At): a cost rule decided beside
// others would settle into the state as it is.
type undatedBatch struct{ *memstore.Store }

func (s undatedBatch) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	err := s.Store.Do(ctx, reqs, results)
	if len(reqs) > 1 {
		for i := range results {
			results[i].At = 0
		}
	}
	return err
}
