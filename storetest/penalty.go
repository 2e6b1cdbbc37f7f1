package storetest

import (
	"context"
	"time"
)

// escalatingPenalty checks block: [3m, 10m, 1h] with forget_after: 24h:
// each rejection that starts a box within 24h of the last box's end gets
// the next box, the last repeating; the history is forgotten exactly 24h
// after the last box ends, and Reset forgets it too. Every box is longer
// than anything the base limit's state needs, so RetryAfter is the box's
// time left, exactly.
func (t *tester) escalatingPenalty() {
	l := t.base()
	l.Block = 3 * time.Minute
	l.Escalate[0], l.Escalate[1] = 10*time.Minute, time.Hour
	l.ForgetAfter = 24 * time.Hour
	// Every instant below lies half a minute from the base limit's window
	// boundaries: a Redis store keeps a fixed window's state for the rest
	// of its window in real time, which must outlast the test's calls.
	t.advance(30 * time.Second)
	// offend uses up the limit (which has recovered since the last box)
	// and is rejected once; the box must be want long.
	offend := func(what string, want time.Duration) time.Time {
		t.Helper()
		if r := t.take("k", l, 4); !r.Allowed {
			t.Fatalf("%s: the recovered limit refused 4: %+v", what, r)
		}
		start := t.h.Clock.Now()
		r := t.take("k", l, 1)
		until := start.Add(want)
		if r.Allowed || !r.BlockedUntil.Equal(until) || r.RetryAfter != want || r.Remaining != 0 {
			t.Fatalf("%s: got allowed=%v blocked_until=%v retry=%v; want a %v box until %v", what, r.Allowed, r.BlockedUntil, r.RetryAfter, want, until)
		}
		// Inside the box, the real end is reported, and nothing escalates.
		t.advance(time.Minute)
		if r := t.take("k", l, 1); r.Allowed || !r.BlockedUntil.Equal(until) || r.RetryAfter != want-time.Minute {
			t.Fatalf("%s, a minute into the box: %+v, want blocked until %v", what, r, until)
		}
		if t.h.TTL != nil {
			if ttl, ok := t.h.TTL(t.key("k"), l); !ok || ttl < want-time.Minute+l.ForgetAfter-time.Second {
				t.Fatalf("%s: state TTL %v, want at least the box's rest and forget_after (%v)", what, ttl, want-time.Minute+l.ForgetAfter)
			}
		}
		t.h.Clock.Set(until)
		return until
	}
	offend("first offence", 3*time.Minute)
	offend("second offence", 10*time.Minute)
	offend("third offence", time.Hour)
	end := offend("fourth offence (the last box repeats)", time.Hour)
	t.h.Clock.Set(end.Add(l.ForgetAfter - time.Microsecond))
	end = offend("1µs before the history is forgotten", time.Hour)
	t.h.Clock.Set(end.Add(l.ForgetAfter))
	offend("forget_after after the last box", 3*time.Minute)
	offend("again within forget_after", 10*time.Minute)
	if err := t.lim.Reset(context.Background(), t.key("k"), l); err != nil {
		t.Fatal(err)
	}
	offend("after Reset (the admin API's unblock)", 3*time.Minute)

	// A plain box on the same key is unaffected by another limit's
	// history, and a limit without escalation never escalates.
	plain := t.base()
	plain.Block = 3 * time.Minute
	for i := 0; i < 3; i++ {
		t.take("plain", plain, 4)
		start := t.h.Clock.Now()
		if r := t.take("plain", plain, 1); !r.BlockedUntil.Equal(start.Add(3 * time.Minute)) {
			t.Fatalf("plain box %d: %+v", i+1, r)
		}
		t.advance(3 * time.Minute)
	}
}
