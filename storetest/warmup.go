package storetest

import (
	"time"

	"github.com/weir-dev/weir"
)

// warmup checks a warm-up of 10 minutes on 30 per minute (burst 30): a
// cold key holds a third of the burst and refills at a third of the rate,
// rising in ten one-minute steps, (10+2k)/30 of the rate in minute k, to
// the whole; a greedy client is admitted exactly 10 + Σ(10+2k) − 1 = 199
// times before the warm-up ends (the 190th refill completes at its very
// end), then at the full rate; and a key idle until its bucket is full is
// cold again.
func (t *tester) warmup() {
	l := weir.Limit{Algorithm: t.algo, Rate: 30, Period: time.Minute, Warmup: 10 * time.Minute}
	if p := t.take("k", l, 0); p.Remaining != 10 || !p.Allowed {
		t.Fatalf("peek on a cold key: %+v, want 10 remaining (a third of 30)", p)
	}
	r := t.take("k", l, 10)
	if !r.Allowed || r.Remaining != 0 {
		t.Fatalf("a cold key's third of the burst: %+v", r)
	}
	r = t.take("k", l, 1)
	if r.Allowed || r.RetryAfter != 6*time.Second {
		t.Fatalf("exhausted in the first step: %+v, want RetryAfter 6s (a third of 0.5/s)", r)
	}
	end := Epoch.Add(10 * time.Minute)
	admitted := 10
	for {
		r := t.take("k", l, 1)
		if r.Allowed {
			admitted++
			continue
		}
		if !t.h.Clock.Now().Add(r.RetryAfter).Before(end) {
			t.h.Clock.Set(end)
			break
		}
		if r.RetryAfter <= 0 {
			t.Fatalf("rejected with RetryAfter %v at %v", r.RetryAfter, t.h.Clock.Now())
		}
		t.advance(r.RetryAfter)
		if r := t.take("k", l, 0); !r.Allowed {
			t.Fatalf("at RetryAfter the request is still refused: %+v", r)
		}
	}
	if admitted != 199 {
		t.Fatalf("admitted %d during the warm-up, want 199", admitted)
	}
	if r := t.take("k", l, 1); !r.Allowed {
		t.Fatalf("at the warm-up's end: %+v", r)
	}
	if r := t.take("k", l, 1); r.Allowed || r.RetryAfter != 2*time.Second {
		t.Fatalf("after the warm-up: %+v, want RetryAfter 2s (the full rate)", r)
	}
	// Idle until the bucket is full (a minute at the full rate), the key is
	// cold again.
	t.advance(time.Minute)
	if r := t.take("k", l, 11); r.Allowed {
		t.Fatalf("11 from a key gone cold: %+v, want refused (a third of 30 is 10)", r)
	}
	if r := t.take("k", l, 10); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("10 from a key gone cold: %+v", r)
	}
}
