package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// debtTests are the conformance tests of Debit, Refund and Reserve/Settle
// (docs/algorithms.md, "Debt"), run per algorithm by Run.
var debtTests = []struct {
	name  string
	clock bool
	fn    func(*tester)
}{
	{"Debt", true, (*tester).debt},
	{"DebtRefund", true, (*tester).debtRefund},
	{"DebtSettle", true, (*tester).debtSettle},
	{"DebtLateSettle", true, (*tester).debtLateSettle},
	{"DebtLateSettleBatch", true, (*tester).debtLateSettleBatch},
	{"DebtPenaltyBox", true, (*tester).debtPenaltyBox},
	{"DebtOutlastsBox", true, (*tester).debtOutlastsBox},
	{"DebtLoweredLimit", true, (*tester).debtLoweredLimit},
	{"DebtBadInput", false, (*tester).debtBadInput},
	{"DebtHammer", false, (*tester).debtHammer},
}

// debts reports whether the tester's algorithm supports debt; when it does
// not, it checks that every debt call fails with ErrUnsupported and
// changes nothing.
func (t *tester) debts() bool {
	t.Helper()
	p, err := t.base().Compile()
	if err != nil {
		t.Fatal(err)
	}
	if p.Debts() {
		return true
	}
	ctx := context.Background()
	l := t.base()
	t.take("u", l, 1)
	for _, f := range []func(context.Context, string, weir.Limit, int64) (weir.Result, error){t.lim.Debit, t.lim.Refund} {
		if _, err := f(ctx, t.key("u"), l, 2); !errors.Is(err, weir.ErrUnsupported) || !strings.Contains(err.Error(), string(t.algo)) {
			t.Fatalf("debt on %s: got %v, want ErrUnsupported naming the algorithm", t.algo, err)
		}
	}
	if _, _, err := t.lim.Reserve(ctx, t.key("u"), l, 1); !errors.Is(err, weir.ErrUnsupported) {
		t.Fatalf("Reserve on %s: got %v, want ErrUnsupported", t.algo, err)
	}
	if r := t.take("u", l, 0); r.Remaining != 3 {
		t.Fatalf("an unsupported debt changed the state: remaining %d, want 3", r.Remaining)
	}
	return false
}

// debtRetry is when a cost of 1 fits again after 10 events were consumed
// at once at the epoch under the base limit (4 per minute), and when the
// key is empty again, per algorithm (docs/algorithms.md has the timelines).
func (t *tester) debtRetry() (retry, reset time.Duration) {
	u := unit
	switch t.algo {
	case weir.FixedWindow:
		// Windows of 4: 10 → 6 → 2 carried; the third window has room.
		return 8 * u, 12 * u
	case weir.SlidingLog:
		// The log keeps at most 2·Rate events (8), all of 0:00: the 5th
		// oldest must leave, a period on.
		return 4 * u, 4 * u
	case weir.SlidingWindow:
		if t.buckets > 0 {
			// 4 buckets of 15s; the ring keeps at most 2·Rate events (8),
			// in the bucket of 0:00. It weighs in full for a period, then
			// 8·(1−e) over the next bucket: 8(1−e) + 1 ≤ 4 from e = 5/8.
			return 4*u + u*5/8, 5 * u
		}
		// 10 carried as cur 10; in window 2 cur is 2 and prev 4, weighted
		// 4·(1−e); 2 + ceil(4(1−e)) + 1 ≤ 4 from e = 3/4.
		return 8*u + 3*u, 16 * u
	}
	// The buckets: 6 owed, then one more event's refill; 10 to be full.
	return 7 * u, 10 * u
}

func (t *tester) debt() {
	if !t.debts() {
		return
	}
	ctx := context.Background()
	l := t.base()
	retry, reset := t.debtRetry()
	res, err := t.lim.Debit(ctx, t.key("k"), l, 10)
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed || res.Granted != 10 || res.Remaining != 0 || res.RetryAfter != retry || res.ResetAfter != reset {
		t.Fatalf("Debit 10 of 4: got %+v; want allowed=false granted=10 remaining=0 retry=%v reset=%v", res, retry, reset)
	}
	// Exact to the microsecond: one µs before RetryAfter nothing fits.
	t.at(retry - time.Microsecond)
	t.expect("peek 1µs before RetryAfter", t.take("k", l, 0), want{false, 0, time.Microsecond})
	t.at(retry)
	if r := t.take("k", l, 1); !r.Allowed {
		t.Fatalf("take at RetryAfter %v: %+v", retry, r)
	}
	// A debit that fits is allowed and goes through as a take does.
	res, err = t.lim.Debit(ctx, t.key("fits"), l, 3)
	if err != nil || !res.Allowed || res.Remaining != 1 || res.RetryAfter != 0 {
		t.Fatalf("Debit 3 of 4 on a fresh key: %+v %v; want allowed, 1 remaining", res, err)
	}
	// A debit of exactly what remains fits too; then one more does not.
	res, _ = t.lim.Debit(ctx, t.key("fits"), l, 1)
	if !res.Allowed || res.Remaining != 0 {
		t.Fatalf("Debit of the last one: %+v", res)
	}
	if res, _ = t.lim.Debit(ctx, t.key("fits"), l, 1); res.Allowed {
		t.Fatalf("Debit past the limit reported allowed: %+v", res)
	}
	// A debit of 0 peeks.
	if res, err = t.lim.Debit(ctx, t.key("zero"), l, 0); err != nil || !res.Allowed || res.Remaining != 4 {
		t.Fatalf("Debit 0: %+v %v", res, err)
	}
}

func (t *tester) debtRefund() {
	if !t.debts() {
		return
	}
	ctx := context.Background()
	l := t.base()
	t.take("k", l, 3)
	res, err := t.lim.Refund(ctx, t.key("k"), l, 2)
	if err != nil || !res.Allowed || res.Remaining != 3 {
		t.Fatalf("Refund 2 after taking 3: %+v %v; want 3 remaining", res, err)
	}
	// Refunds stop at an empty state: nothing beyond the limit appears.
	if res, _ = t.lim.Refund(ctx, t.key("k"), l, 100); res.Remaining != 4 {
		t.Fatalf("Refund 100: %+v; want 4 remaining", res)
	}
	t.expect("take 4 after the refunds", t.take("k", l, 4), want{true, 0, 0})
	if r := t.take("k", l, 1); r.Allowed {
		t.Fatalf("a refund went past empty: %+v", r)
	}
	// A refund pays debt back: 6 consumed, 3 back, 1 remains.
	if _, err := t.lim.Debit(ctx, t.key("d"), l, 6); err != nil {
		t.Fatal(err)
	}
	if res, _ = t.lim.Refund(ctx, t.key("d"), l, 3); !res.Allowed || res.Remaining != 1 || res.RetryAfter != 0 {
		t.Fatalf("Refund 3 of a debt of 2: %+v; want 1 remaining", res)
	}
	t.expect("take after paying the debt", t.take("d", l, 1), want{true, 0, 0})
}

func (t *tester) debtSettle() {
	if !t.debts() {
		return
	}
	ctx := context.Background()
	l := t.base()
	r1, res, err := t.lim.Reserve(ctx, t.key("k"), l, 3)
	if err != nil || r1 == nil || res.Remaining != 1 {
		t.Fatalf("Reserve 3: %v %+v %v", r1, res, err)
	}
	if res, err = r1.Settle(ctx, 1); err != nil || res.Remaining != 3 {
		t.Fatalf("Settle 1 of 3: %+v %v; want 3 remaining", res, err)
	}
	if _, err = r1.Settle(ctx, 1); !errors.Is(err, weir.ErrSettled) {
		t.Fatalf("second Settle: %v, want ErrSettled", err)
	}
	if _, err = r1.Settle(ctx, -1); !errors.Is(err, weir.ErrInvalidCost) {
		t.Fatalf("Settle -1: %v, want ErrInvalidCost", err)
	}
	// An unsettled reservation stays charged at its estimate.
	r2, res, err := t.lim.Reserve(ctx, t.key("k"), l, 3)
	if err != nil || r2 == nil || res.Remaining != 0 {
		t.Fatalf("second Reserve 3: %v %+v %v", r2, res, err)
	}
	if r, _, _ := t.lim.Reserve(ctx, t.key("k"), l, 1); r != nil {
		t.Fatal("Reserve admitted past the limit")
	}
	// Settling at 9 debits 6: 10 consumed at the epoch in all, as in Debt.
	retry, _ := t.debtRetry()
	if res, err = r2.Settle(ctx, 9); err != nil || res.Allowed || res.RetryAfter != retry {
		t.Fatalf("Settle 9 of 3: %+v %v; want not allowed, retry %v", res, err, retry)
	}
	// Settling at the estimate changes nothing.
	t.at(time.Hour)
	r3, _, _ := t.lim.Reserve(ctx, t.key("e"), l, 2)
	if res, err = r3.Settle(ctx, 2); err != nil || res.Remaining != 2 {
		t.Fatalf("Settle at the estimate: %+v %v", res, err)
	}
}

// debtLateSettle: a settlement's refund gives back only what the limit
// cannot have recovered since the take (docs/algorithms.md, "Debt"). The
// late-settlement reproductions: a reservation of the whole limit (4) settled
// at 0 after its window, trailing period or refill has passed and others
// took the limit again must give nothing back, so that no window or
// period admits more than a valid history allows; one settled while its
// take still counts gives back exactly what is owed.
func (t *tester) debtLateSettle() {
	if !t.debts() {
		return
	}
	ctx := context.Background()
	l := t.base()
	reserve := func(key string, n int64) *weir.Reservation {
		t.Helper()
		r, res, err := t.lim.Reserve(ctx, t.key(key), l, n)
		if err != nil || r == nil || !res.Allowed {
			t.Fatalf("Reserve %d on %s: %v %+v %v", n, key, r, res, err)
		}
		if r.Stamp.IsZero() {
			t.Fatalf("the store left the reservation unstamped: %+v", r)
		}
		return r
	}
	settle := func(r *weir.Reservation, actual, remaining int64) {
		t.Helper()
		res, err := r.Settle(ctx, actual)
		if err != nil || !res.Allowed || res.Remaining != remaining {
			t.Fatalf("Settle %d of %d: %+v %v; want %d remaining", actual, r.Estimate, res, err, remaining)
		}
	}
	bucket := t.algo == weir.TokenBucket || t.algo == weir.GCRA || t.algo == weir.LeakyBucket

	// The take has stopped counting, others took the whole limit since:
	// nothing comes back.
	t.at(59 * time.Second)
	r := reserve("late", 4)
	switch {
	case t.algo == weir.FixedWindow:
		t.at(61 * time.Second) // the next window
	case bucket:
		t.at(59*time.Second + 4*unit) // refilled to full
	default:
		t.at(120 * time.Second) // out of the trailing period (and its buckets)
	}
	t.expect("others take the whole limit", t.take("late", l, 4), want{true, 0, 0})
	settle(r, 0, 0)
	rej := t.take("late", l, 1)
	if rej.Allowed {
		t.Fatalf("a late settlement gave back capacity the limit had recovered: %+v", rej)
	}

	// The take still counts: the settlement gives back what is owed, as
	// if the take had cost the actual at its time.
	t.at(time.Hour + time.Second)
	r = reserve("owed", 4)
	if bucket {
		// 2 refilled, and others took them: had the take cost 0, the
		// bucket would have stayed full and 2 would remain.
		t.advance(2 * unit)
		t.expect("others take the refill", t.take("owed", l, 2), want{true, 0, 0})
		settle(r, 0, 2)
		t.expect("take 2 after the settlement", t.take("owed", l, 2), want{true, 0, 0})
		if res := t.take("owed", l, 1); res.Allowed {
			t.Fatalf("a settlement gave back more than was owed: %+v", res)
		}
		return
	}
	// 30s on: the same fixed window, the same trailing period; the
	// bucketed window still counts the take's bucket in full.
	t.advance(30 * time.Second)
	settle(r, 1, 3)
	t.expect("take 3 after the settlement", t.take("owed", l, 3), want{true, 0, 0})

	// Takes of others in the take's own microsecond (one sliding-log entry
	// in memstore, several members in Redis): a settlement at once gives
	// back exactly its own refund, and the events left leave together.
	t.at(2 * time.Hour)
	t.expect("another take at the same instant", t.take("same", l, 1), want{true, 3, 0})
	r = reserve("same", 3)
	settle(r, 1, 2)
	t.expect("take 2 after the settlement", t.take("same", l, 2), want{true, 0, 0})
	res := t.take("same", l, 1)
	if res.Allowed || res.RetryAfter <= 0 {
		t.Fatalf("a settlement at the same instant gave back more than its refund: %+v", res)
	}
	t.advance(res.RetryAfter)
	if res := t.take("same", l, 1); !res.Allowed {
		t.Fatalf("rejected at its RetryAfter: %+v", res)
	}

	// Bad stamps: ErrInvalidCost naming the value, and nothing changes.
	ms := t.h.Store
	t.take("bad", l, 4)
	at := t.h.Clock.Now().UnixMicro()
	for _, c := range []struct {
		n    int64
		st   weir.Stamp
		want string
	}{
		{3, weir.Stamp{At: at, Estimate: 2}, "estimate 2"},
		{1, weir.Stamp{At: -5, Estimate: 2}, "-5"},
		{1, weir.Stamp{At: at, Estimate: 2, Remaining: -7}, "-7"},
	} {
		req := [1]weir.Request{{Key: t.key("bad"), Limit: l, N: c.n, Mode: weir.ModeRefund, Stamp: c.st}}
		var out [1]weir.Result
		if err := ms.Do(ctx, req[:], out[:]); !errors.Is(err, weir.ErrInvalidCost) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("a settlement with %+v of %d: %v, want ErrInvalidCost naming %s", c.st, c.n, err, c.want)
		}
	}
	if res := t.take("bad", l, 0); res.Remaining != 0 {
		t.Fatalf("a refused settlement changed the state: %+v", res)
	}
}

// debtLateSettleBatch: a take decided in an all-or-nothing batch with
// another request (a policy's "requests and tokens per minute" on one key,
// Result.At) is dated as a reservation is, and its settlement
// refunds by that time: the late-settlement reproduction, late and on time, with
// the other request on another key (another slot on a Redis Cluster: each
// slot's script dates its own takes) and on the same key under another
// algorithm (one slot, one script).
func (t *tester) debtLateSettleBatch() {
	if !t.debts() {
		return
	}
	sa := stamper{t.h.Store}
	ctx := context.Background()
	l := t.base()
	other := weir.GCRA
	if t.algo == weir.GCRA {
		other = weir.TokenBucket
	}
	rpm := weir.Limit{Algorithm: other, Rate: 100, Period: time.Minute}
	bucket := t.algo == weir.TokenBucket || t.algo == weir.GCRA || t.algo == weir.LeakyBucket
	for _, c := range []struct {
		name string
		rkey func(string) string // the key of the other request
	}{
		{"another key", func(k string) string { return k + "-rpm" }},
		{"the same key", func(k string) string { return k }},
	} {
		// reserve takes n of key under l and 1 of the other request in one
		// batch and returns the cost request's stamp.
		reserve := func(key string, n int64) weir.Stamp {
			t.Helper()
			reqs := []weir.Request{{Key: t.key(c.rkey(key)), Limit: rpm, N: 1}, {Key: t.key(key), Limit: l, N: n}}
			res := make([]weir.Result, 2)
			stamps := make([]weir.Stamp, 2)
			if err := sa.TakeAllStamped(ctx, reqs, res, stamps); err != nil || !res[0].Allowed || !res[1].Allowed {
				t.Fatalf("%s: the batch on %s: %+v %v", c.name, key, res, err)
			}
			now := t.h.Clock.Now().UnixMicro()
			if want := (weir.Stamp{At: now, Estimate: n, Remaining: res[1].Remaining}); stamps[1] != want {
				t.Fatalf("%s: the cost request's stamp %+v, want %+v", c.name, stamps[1], want)
			}
			if want := (weir.Stamp{At: now, Estimate: 1, Remaining: res[0].Remaining}); stamps[0] != want {
				t.Fatalf("%s: the other request's stamp %+v, want %+v", c.name, stamps[0], want)
			}
			return stamps[1]
		}
		settle := func(key string, st weir.Stamp, actual, remaining int64) {
			t.Helper()
			res, err := t.lim.SettleStamped(ctx, t.key(key), l, st, actual)
			if err != nil || !res.Allowed || res.Remaining != remaining {
				t.Fatalf("%s: settle %d of %d: %+v %v; want %d remaining", c.name, actual, st.Estimate, res, err, remaining)
			}
		}
		p := "b" + strconv.Itoa(len(c.name)) + "-"

		// Late: the take has stopped counting and others took the whole
		// limit since; nothing comes back.
		t.at(59 * time.Second)
		st := reserve(p+"late", 4)
		switch {
		case t.algo == weir.FixedWindow:
			t.at(61 * time.Second)
		case bucket:
			t.at(59*time.Second + 4*unit)
		default:
			t.at(120 * time.Second)
		}
		t.expect(c.name+": others take the whole limit", t.take(p+"late", l, 4), want{true, 0, 0})
		// A rejected batch consumes nothing and dates nothing.
		reqs := []weir.Request{{Key: t.key(c.rkey(p + "late")), Limit: rpm, N: 1}, {Key: t.key(p + "late"), Limit: l, N: 1}}
		res := make([]weir.Result, 2)
		stamps := []weir.Stamp{{At: 1}, {At: 1}}
		if err := sa.TakeAllStamped(ctx, reqs, res, stamps); err != nil || res[1].Allowed || stamps[0] != (weir.Stamp{}) || stamps[1] != (weir.Stamp{}) {
			t.Fatalf("%s: a rejected batch: %+v %+v %v, want zero stamps", c.name, res, stamps, err)
		}
		settle(p+"late", st, 0, 0)
		if res := t.take(p+"late", l, 1); res.Allowed {
			t.Fatalf("%s: a late settlement of a batch's take gave back capacity the limit had recovered: %+v", c.name, res)
		}

		// On time: the settlement gives back what is owed.
		t.at(time.Hour + time.Second)
		st = reserve(p+"owed", 4)
		if bucket {
			t.advance(2 * unit)
			t.expect(c.name+": others take the refill", t.take(p+"owed", l, 2), want{true, 0, 0})
			settle(p+"owed", st, 0, 2)
			t.expect(c.name+": take 2 after the settlement", t.take(p+"owed", l, 2), want{true, 0, 0})
		} else {
			t.advance(30 * time.Second)
			settle(p+"owed", st, 1, 3)
			t.expect(c.name+": take 3 after the settlement", t.take(p+"owed", l, 3), want{true, 0, 0})
		}
		if res := t.take(p+"owed", l, 1); res.Allowed {
			t.Fatalf("%s: a settlement gave back more than was owed: %+v", c.name, res)
		}
	}
}

// debtLoweredLimit: a window's debt is paid back at the rate of the limit
// it was written under. A limit lowered since (4 per minute to 2) counts
// what is left of it in full, but does not slow its payback: the debt
// ends when the TTL the store set at the debit ends, so a store that
// expires the key then (Redis) and one that keeps it longer (memstore)
// decide alike.
func (t *tester) debtLoweredLimit() {
	if t.algo != weir.FixedWindow && t.algo != weir.SlidingWindow {
		t.Skip("only the windows' debt carries over windows of the limit's rate")
	}
	l, lo := t.base(), t.limit(2, time.Minute)
	u, us := unit, time.Microsecond
	res, err := t.lim.Debit(context.Background(), t.key("k"), l, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, end := t.debtRetry()
	if res.ResetAfter != end {
		t.Fatalf("Debit 10 of 4: %+v, want ResetAfter %v", res, end)
	}
	if t.h.TTL != nil {
		if ttl, ok := t.h.TTL(t.key("k"), l); !ok || ttl > end+t.h.TTLSlack {
			t.Fatalf("after Debit 10 of 4: TTL %v (kept %v), want at most ResetAfter %v", ttl, ok, end)
		}
	}
	// A minute on, under 2 per minute: what is carried counts in full,
	// and is paid back 4 a window.
	var retry, reset time.Duration
	switch {
	case t.algo == weir.FixedWindow:
		// 6 carried (10 − 4): 2 more at 2:00; empty at 3:00.
		retry, reset = 8*u, 8*u
	case t.buckets > 0:
		// The ring's 8 in the bucket of 0:00 leave over 1:00..1:15 (a
		// bucketed debt counts in full until it leaves, whatever the rate):
		// 8·(1−e) + 1 ≤ 2 from e = 7/8.
		retry, reset = u*7/8, u
	default:
		// cur 6, prev 10 capped at 2; at 3:00 prev is 2 and cur 0, the
		// estimate ceil(2(1−e)) + 1 ≤ 2 from e = 1/2; cur empties at 4:00.
		retry, reset = 10*u, 12*u
	}
	t.at(4 * u)
	r := t.take("k", lo, 0)
	if r.Allowed || r.Remaining != 0 || r.RetryAfter != retry || r.ResetAfter != reset {
		t.Fatalf("a peek under 2/min a minute after Debit 10 of 4: %+v, want retry %v, reset %v", r, retry, reset)
	}
	t.at(4*u + retry - us)
	t.expect("a peek under 2/min 1µs before RetryAfter", t.take("k", lo, 0), want{false, 0, us})
	// When the debit's TTL ends, the key is empty under the lowered limit.
	t.at(end)
	if r := t.take("k", lo, 0); !r.Allowed || r.Remaining != 2 || r.ResetAfter != 0 {
		t.Fatalf("a peek under 2/min when the debit's TTL ends: %+v, want an empty key", r)
	}
}

func (t *tester) debtPenaltyBox() {
	if !t.debts() {
		return
	}
	ctx := context.Background()
	l := t.base()
	l.Block = 5 * time.Minute
	res, err := t.lim.Debit(ctx, t.key("k"), l, 10)
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed || !res.BlockedUntil.Equal(Epoch.Add(l.Block)) || res.RetryAfter != l.Block {
		t.Fatalf("Debit past a limit with block: %+v; want boxed until %v", res, Epoch.Add(l.Block))
	}
	t.at(l.Block - time.Microsecond)
	if r := t.take("k", l, 1); r.Allowed {
		t.Fatalf("admitted inside the box: %+v", r)
	}
	t.at(l.Block)
	if r := t.take("k", l, 1); !r.Allowed {
		t.Fatalf("rejected when the box ended (the debt is paid by then): %+v", r)
	}
	// A debit that fits starts no box.
	if res, _ = t.lim.Debit(ctx, t.key("ok"), l, 4); !res.Allowed || !res.BlockedUntil.IsZero() {
		t.Fatalf("a fitting debit: %+v", res)
	}
}

// debtOutlastsBox: a penalty box shorter than the debt lasts as long as
// the debt, so that the box's answer (RetryAfter, BlockedUntil) is the
// truth and obeying it is never met by a rejection that boxes the key
// again.
func (t *tester) debtOutlastsBox() {
	if !t.debts() {
		return
	}
	ctx := context.Background()
	l := t.base()
	l.Block = time.Second
	retry, _ := t.debtRetry()
	res, err := t.lim.Debit(ctx, t.key("k"), l, 10)
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed || res.RetryAfter != retry || !res.BlockedUntil.Equal(Epoch.Add(retry)) {
		t.Fatalf("Debit of 10 past a limit with a 1s box: %+v; want RetryAfter %v and the box until then", res, retry)
	}
	t.at(2 * time.Second)
	if r := t.take("k", l, 0); r.RetryAfter != retry-2*time.Second {
		t.Fatalf("a peek inside the box: RetryAfter %v, want %v (the debt's end)", r.RetryAfter, retry-2*time.Second)
	}
	t.at(retry - time.Microsecond)
	if r := t.take("k", l, 1); r.Allowed {
		t.Fatalf("admitted before the debt was paid: %+v", r)
	}
	t.at(retry)
	if r := t.take("k", l, 1); !r.Allowed {
		t.Fatalf("rejected at the RetryAfter the box gave: %+v", r)
	}
}

func (t *tester) debtBadInput() {
	if !t.debts() {
		return
	}
	ctx := context.Background()
	l := t.base()
	t.take("k", l, 1)
	for _, n := range []int64{-1, -1 << 62, algorithm.MaxDebt + 1, 1 << 62} {
		for name, f := range map[string]func(context.Context, string, weir.Limit, int64) (weir.Result, error){"Debit": t.lim.Debit, "Refund": t.lim.Refund} {
			if _, err := f(ctx, t.key("k"), l, n); !errors.Is(err, weir.ErrInvalidCost) || !strings.Contains(err.Error(), fmt.Sprint(n)) {
				t.Fatalf("%s %d: got %v, want ErrInvalidCost naming %d", name, n, err, n)
			}
		}
		if _, _, err := t.lim.Reserve(ctx, t.key("k"), l, n); !errors.Is(err, weir.ErrInvalidCost) {
			t.Fatalf("Reserve %d: got %v, want ErrInvalidCost", n, err)
		}
	}
	// A batch of several requests only takes.
	ms := t.h.Store
	reqs := []weir.Request{{Key: t.key("a"), Limit: l, N: 1, Mode: weir.ModeDebit}, {Key: t.key("b"), Limit: l, N: 1}}
	if err := ms.Do(ctx, reqs, make([]weir.Result, 2)); !errors.Is(err, weir.ErrUnsupported) {
		t.Fatalf("a batch with a debit: %v, want ErrUnsupported", err)
	}
	t.expect("state after bad input", t.take("k", l, 0), want{true, 3, 0})
	// A huge debit saturates at the debt's bound instead of failing.
	if res, err := t.lim.Debit(ctx, t.key("huge"), l, algorithm.MaxDebt); err != nil || res.Allowed || res.RetryAfter <= 0 {
		t.Fatalf("Debit MaxDebt: %+v %v", res, err)
	}
}

// debtHammer: many goroutines reserve 1 each and settle at 0 or 2; a
// limit of 100 never admits a 101st reservation, and the settlements
// leave exactly the expected count.
func (t *tester) debtHammer() {
	if !t.debts() {
		return
	}
	const goroutines, tries, rate = 24, 10, 100
	ctx := context.Background()
	l := t.limit(rate, time.Hour)
	var admitted, twos atomic.Int64
	var mu sync.Mutex
	var rs []*weir.Reservation
	var wg sync.WaitGroup
	errc := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < tries; i++ {
				r, _, err := t.lim.Reserve(ctx, t.key("h"), l, 1)
				if err != nil {
					errc <- err
					return
				}
				if r != nil {
					admitted.Add(1)
					mu.Lock()
					rs = append(rs, r)
					mu.Unlock()
				}
			}
		}(g)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if got := admitted.Load(); got != rate {
		t.Fatalf("%d reservations admitted by %d goroutines, want exactly %d", got, goroutines, rate)
	}
	// Refund 60 and debit 30 concurrently: 100 − 60 + 30 = 70 consumed.
	// With a stopped clock the refunds are 60 reservations settled at 0
	// (their dated refunds, through the store's batches), else plain ones.
	wg = sync.WaitGroup{}
	for g := 0; g < 90; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var err error
			if g < 60 && t.h.Clock != nil {
				_, err = rs[g].Settle(ctx, 0)
			} else if g < 60 {
				_, err = t.lim.Refund(ctx, t.key("h"), l, 1)
			} else {
				twos.Add(1)
				_, err = t.lim.Debit(ctx, t.key("h"), l, 1)
			}
			if err != nil {
				t.Error(err)
			}
		}(g)
	}
	wg.Wait()
	if r := t.take("h", l, 0); r.Remaining != rate-70 {
		t.Fatalf("after 60 refunds and %d debits: %d remaining, want %d", twos.Load(), r.Remaining, rate-70)
	}
}

// stamper reads the Stamps of a batch's admitted takes from its Results.
type stamper struct{ s weir.Store }

// TakeAllStamped decides reqs with Do and sets stamps[i] to request i's
// Stamp (Result.At; zero when its take was not dated).
func (sa stamper) TakeAllStamped(ctx context.Context, reqs []weir.Request, res []weir.Result, stamps []weir.Stamp) error {
	err := sa.s.Do(ctx, reqs, res)
	for i := range reqs {
		stamps[i] = weir.Stamp{}
		if err == nil {
			stamps[i] = res[i].Stamp(reqs[i].N)
		}
	}
	return err
}
