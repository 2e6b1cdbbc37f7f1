package policy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/store/memstore"
)

const callRules = `
rules:
  - {name: per-ip, identity: ip, limit: 10/h, algorithm: fixed_window}
  - name: failures
    identity: ip
    limit: 2/h
    algorithm: fixed_window
    count: { status: [401] }
`

// remaining peeks at what a rule leaves the test client.
func remaining(t *testing.T, p *Policy, rule string) int64 {
	t.Helper()
	rr, err := p.CheckKey(ctx, rule, "192.0.2.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	return rr.Result.Remaining
}

// CheckCall takes a count rule's cost before the handler; FinishCall gives
// it back for a status the rule does not count and keeps it for one it
// counts.
func TestCheckCallTakesCountRulesAndFinishCallRefunds(t *testing.T) {
	at := time.Date(2030, 1, 1, 10, 1, 0, 0, time.UTC)
	p := mustPolicy(t, callRules, memstore.New(memstore.WithClock(func() time.Time { return at })))
	v := p.CheckCall(ctx, req("POST", "/login"))
	if !v.Allowed {
		t.Fatalf("first call refused: %+v", v)
	}
	if got := remaining(t, p, "failures"); got != 1 {
		t.Fatalf("after CheckCall the count rule leaves %d, want 1 (taken before the handler)", got)
	}
	if err := p.FinishCall(ctx, &v, 200); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, p, "failures"); got != 2 {
		t.Fatalf("after an uncounted 200 the count rule leaves %d, want 2 (refunded)", got)
	}
	for i := range 2 {
		v := p.CheckCall(ctx, req("POST", "/login"))
		if !v.Allowed {
			t.Fatalf("failure %d refused: %+v", i+1, v)
		}
		if err := p.FinishCall(ctx, &v, 401); err != nil {
			t.Fatal(err)
		}
	}
	if v := p.CheckCall(ctx, req("POST", "/login")); v.Allowed {
		t.Fatalf("third failure admitted: %+v", v)
	}
	// The per-ip rule counted every admitted call, and nothing for the refused one.
	if got := remaining(t, p, "per-ip"); got != 7 {
		t.Fatalf("per-ip leaves %d, want 7", got)
	}
}

// When a count rule's take is refused after Check's peek admitted (another
// request took the last unit in between), the call is refused and the
// other rules give back what they took.
func TestCheckCallRefusedTakeGivesBack(t *testing.T) {
	at := time.Date(2030, 1, 1, 10, 1, 0, 0, time.UTC)
	store := memstore.New(memstore.WithClock(func() time.Time { return at }))
	var p *Policy
	var race atomic.Bool
	observe := func(ctx context.Context, r RuleResult, _ time.Duration) {
		if r.Rule == "failures" && race.CompareAndSwap(true, false) {
			// Another request takes the last units between the peek and the take.
			if _, err := store.Take(ctx, r.Key, r.Limit, 2); err != nil {
				t.Error(err)
			}
		}
	}
	p = mustPolicy(t, callRules, store, WithObserver(observe))
	race.Store(true)
	v := p.CheckCall(ctx, req("POST", "/login"))
	if v.Allowed {
		t.Fatalf("admitted although the count rule's take was refused: %+v", v)
	}
	if rr, ok := v.Limited(); !ok || rr.Rule != "failures" || rr.Result.Allowed {
		t.Fatalf("limiting result %+v, want the failures rule's refusal", rr)
	}
	if got := remaining(t, p, "per-ip"); got != 10 {
		t.Fatalf("per-ip leaves %d after a refused call, want 10 (given back)", got)
	}
}
