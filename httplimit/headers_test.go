package httplimit

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

func TestDraftHeadersSeveralRules(t *testing.T) {
	statuses := []Status{
		{Rule: "api", Limit: weir.Limit{Rate: 100, Period: time.Minute},
			Result: weir.Result{Allowed: true, Limit: 100, Remaining: 42, ResetAfter: 30 * time.Second}},
		{Rule: "login", Limit: weir.Limit{Rate: 5, Period: 15 * time.Minute},
			Result: weir.Result{Allowed: false, Limit: 5, RetryAfter: 411200 * time.Millisecond, ResetAfter: 412 * time.Second}},
		{Rule: "probe", Shadow: true, Limit: weir.Limit{Rate: 1, Period: 1500 * time.Millisecond},
			Result: weir.Result{Allowed: false, Limit: 1, RetryAfter: time.Hour, ResetAfter: time.Hour}},
	}
	limiting := MostRestrictive(statuses)
	if limiting != 1 {
		t.Fatalf("MostRestrictive = %d, want 1", limiting)
	}
	h := http.Header{}
	WriteHeaders(h, statuses, limiting, DraftHeaders{Legacy: true})
	want := map[string]string{
		"RateLimit-Policy":      `"api";q=100;w=60, "login";q=5;w=900, "probe";q=1;w=2`,
		"RateLimit":             `"login";r=0;t=412`,
		"Retry-After":           "412",
		"X-RateLimit-Limit":     "5",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "412",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if len(h) != len(want) {
		t.Errorf("headers %v, want exactly %v", h, want)
	}
}

func TestDraftHeadersShadowNeverSetsRetryAfter(t *testing.T) {
	statuses := []Status{
		{Rule: "probe", Shadow: true, Limit: weir.Limit{Rate: 1, Period: time.Second},
			Result: weir.Result{Allowed: false, Limit: 1, RetryAfter: time.Second, ResetAfter: time.Second}},
		{Rule: "api", Limit: weir.Limit{Rate: 10, Period: time.Second},
			Result: weir.Result{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: 100 * time.Millisecond}},
	}
	h := http.Header{}
	WriteHeaders(h, statuses, MostRestrictive(statuses), nil)
	if got := h.Get("RateLimit"); got != `"api";r=9;t=1` {
		t.Errorf("RateLimit = %q: an enforced rule goes before a shadow one", got)
	}
	if got := h.Get("Retry-After"); got != "" {
		t.Errorf("Retry-After = %q for a shadow rejection", got)
	}
	if got := h.Get("X-RateLimit-Limit"); got != "" {
		t.Errorf("legacy headers are on by default")
	}
	// With only shadow rules, the shadow one is reported.
	h = http.Header{}
	WriteHeaders(h, statuses[:1], MostRestrictive(statuses[:1]), nil)
	if got := h.Get("RateLimit"); got != `"probe";r=0;t=1` {
		t.Errorf("RateLimit = %q", got)
	}
}

func TestDraftHeadersEdgeCases(t *testing.T) {
	h := http.Header{}
	WriteHeaders(h, nil, -1, nil)
	if len(h) != 0 {
		t.Errorf("no statuses wrote %v", h)
	}
	st := []Status{{Rule: `a"b\c` + "\x01é", Limit: weir.Limit{Rate: 3, Period: time.Second},
		Result: weir.Result{Allowed: false, RetryAfter: 0}}}
	WriteHeaders(h, st, -1, nil)
	if got := h.Get("RateLimit-Policy"); got != `"a\"b\\c???";q=3;w=1` {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	if got := h.Get("RateLimit"); got != "" {
		t.Errorf("RateLimit = %q with no limiting status", got)
	}
	if got := h.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q for a rejection with no delay, want 1", got)
	}
}

func TestMostRestrictive(t *testing.T) {
	allowed := func(rem int64, reset time.Duration) Status {
		return Status{Result: weir.Result{Allowed: true, Remaining: rem, ResetAfter: reset}}
	}
	rejected := func(retry time.Duration) Status {
		return Status{Result: weir.Result{RetryAfter: retry, ResetAfter: retry}}
	}
	shadow := func(s Status) Status { s.Shadow = true; return s }
	for _, tc := range []struct {
		name string
		in   []Status
		want int
	}{
		{"none", nil, -1},
		{"one", []Status{allowed(3, time.Second)}, 0},
		{"fewest remaining", []Status{allowed(3, time.Second), allowed(1, time.Second), allowed(2, time.Hour)}, 1},
		{"latest reset breaks ties", []Status{allowed(1, time.Second), allowed(1, time.Minute)}, 1},
		{"rejection first", []Status{allowed(0, time.Hour), rejected(time.Second)}, 1},
		{"longest retry", []Status{rejected(time.Second), rejected(time.Minute), rejected(time.Millisecond)}, 1},
		{"enforced before shadow", []Status{shadow(rejected(time.Hour)), allowed(5, time.Second)}, 1},
		{"shadow alone", []Status{shadow(allowed(5, time.Second)), shadow(rejected(time.Second))}, 1},
	} {
		if got := MostRestrictive(tc.in); got != tc.want {
			t.Errorf("%s: MostRestrictive = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		-time.Second: 0, 0: 0, time.Nanosecond: 1, time.Second: 1,
		time.Second + time.Microsecond: 2, 900 * time.Second: 900,
		1<<63 - 1: 9223372037,
	} {
		if got := ceilSeconds(d); got != want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
	for d, want := range map[time.Duration]int64{0: 1, 1500 * time.Millisecond: 2, 1<<63 - 1: 1<<31 - 1} {
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// BenchmarkAllowed measures the allowed path of New, headers included.
func BenchmarkAllowed(b *testing.B) {
	lim := weir.NewLimiter(memstore.New())
	h := New(lim, weir.Limit{Algorithm: weir.GCRA, Rate: 1_000_000_000, Period: time.Second})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		h.ServeHTTP(w, r)
	}
}

type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// countFormatter is a custom formatter: one header with the statuses seen.
type countFormatter struct{ seen *[]Status }

func (f countFormatter) WriteHeaders(h http.Header, statuses []Status, limiting int) {
	*f.seen = append(*f.seen, statuses...)
	h.Set("X-Limits", strconv.Itoa(len(statuses))+"/"+strconv.Itoa(limiting))
}

func TestWithHeaderFormatter(t *testing.T) {
	var seen []Status
	c := newClock()
	h := New(newLimiter(c), login, WithHeaderFormatter(countFormatter{&seen}), WithLegacyHeaders(true))(hello)
	w := do(h, "192.0.2.1:1")
	wantHeader(t, w, "X-Limits", "1/0")
	wantHeader(t, w, "RateLimit", "")
	wantHeader(t, w, "X-RateLimit-Limit", "")
	if len(seen) != 1 || seen[0].Rule != "default" || seen[0].Result.Remaining != 4 {
		t.Errorf("formatter saw %+v", seen)
	}
}
