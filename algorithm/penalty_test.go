package algorithm_test

import (
	"errors"
	"testing"

	"github.com/weir-dev/weir/algorithm"
)

func TestCompilePenaltyErrors(t *testing.T) {
	const m = 60_000_000
	for _, c := range []struct {
		name    string
		cfg     algorithm.Config
		field   algorithm.Field
		problem algorithm.Problem
	}{
		{"unsorted", algorithm.Config{Kind: algorithm.GCRA, Rate: 1, Period: m, Block: 10 * m, Escalate: [7]int64{m}, ForgetAfter: 60 * m}, algorithm.FieldBlock, algorithm.Invalid},
		{"equal", algorithm.Config{Kind: algorithm.GCRA, Rate: 1, Period: m, Block: m, Escalate: [7]int64{m}, ForgetAfter: 60 * m}, algorithm.FieldBlock, algorithm.Invalid},
		{"gap", algorithm.Config{Kind: algorithm.GCRA, Rate: 1, Period: m, Block: m, Escalate: [7]int64{2 * m, 0, 3 * m}, ForgetAfter: 60 * m}, algorithm.FieldBlock, algorithm.Invalid},
		{"no first box", algorithm.Config{Kind: algorithm.GCRA, Rate: 1, Period: m, Escalate: [7]int64{2 * m}, ForgetAfter: 60 * m}, algorithm.FieldBlock, algorithm.Invalid},
		{"no forget_after", algorithm.Config{Kind: algorithm.GCRA, Rate: 1, Period: m, Block: m, Escalate: [7]int64{2 * m}}, algorithm.FieldForgetAfter, algorithm.NeedsOther},
		{"forget_after alone", algorithm.Config{Kind: algorithm.GCRA, Rate: 1, Period: m, Block: m, ForgetAfter: 60 * m}, algorithm.FieldForgetAfter, algorithm.NeedsOther},
		{"negative forget_after", algorithm.Config{Kind: algorithm.GCRA, Rate: 1, Period: m, Block: m, ForgetAfter: -1}, algorithm.FieldForgetAfter, algorithm.Invalid},
	} {
		_, err := algorithm.Compile(c.cfg)
		var fe *algorithm.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || fe.Problem != c.problem {
			t.Errorf("%s: got %v, want a %v error on %v", c.name, err, c.problem, c.field)
		}
	}
}

// TestEscalationSteps: the boxes follow the list, the last repeats, and
// the history is forgotten exactly ForgetAfter after the last box ends.
func TestEscalationSteps(t *testing.T) {
	const s = 1_000_000
	p, err := algorithm.Compile(algorithm.Config{Kind: algorithm.FixedWindow, Rate: 1, Period: s, Block: 60 * s, Escalate: [7]int64{600 * s, 3600 * s}, ForgetAfter: 86400 * s})
	if err != nil {
		t.Fatal(err)
	}
	var st algorithm.State
	now := int64(1_000_000_000 * s)
	offend := func(want int64) {
		t.Helper()
		now += 2 * s // a fresh window
		if d := algorithm.Take(&p, &st, now, 1, algorithm.Exact); !d.Allowed {
			t.Fatalf("fresh window refused: %+v", d)
		}
		d := algorithm.Take(&p, &st, now, 1, algorithm.Exact)
		if d.Allowed || d.BlockedUntil != now+want || d.RetryAfter != want || d.TTL < want+p.ForgetAfter {
			t.Fatalf("got %+v, want a %dµs box kept %dµs", d, want, want+p.ForgetAfter)
		}
		now += want
	}
	offend(60 * s)
	offend(600 * s)
	offend(3600 * s)
	offend(3600 * s)
	now += p.ForgetAfter - 2*s - 1 // the next offence is 1µs before the history goes
	offend(3600 * s)
	now += p.ForgetAfter - 2*s
	offend(60 * s)
}
